"""Gradient buckets: which parts of the flat gradient vector are all-reduced together, and when.

The backward pass writes gradients last layer first. PyTorch's DDP all-reduces buckets of about
``bucket_cap_mb`` each as soon as its last gradient is written, while the GPU goes on with earlier layers:
small buckets start sooner, but each all-reduce pays a fixed latency. Here layers (W and b) join the current
bucket, last layer first, until it holds ``bucket_bytes``. Each bucket is a contiguous range of the flat
vector; the first also carries the loss slots at its end (ready before the backward pass starts).
"""
from __future__ import annotations

from dataclasses import dataclass

from hpclab.ddp.model import EXTRA_SLOTS, count_parameters


@dataclass(frozen=True)
class Bucket:
    start: int        # the range [start, stop) of the flat gradient vector (with the extra slots)
    stop: int
    ready_after: int  # the layer whose gradient completes it (the lowest-numbered layer in it)


def plan(sizes, bucket_bytes: float, itemsize: int) -> list[Bucket]:
    """Buckets in the order the backward pass completes them."""
    if not bucket_bytes > 0:
        raise ValueError(f"the bucket size must be positive (got {bucket_bytes} bytes)")
    # where each layer's W starts in the flat vector, and the end of the last layer
    offsets = [count_parameters(sizes[:i + 1]) if i else 0 for i in range(len(sizes))]
    buckets, stop = [], offsets[-1] + EXTRA_SLOTS
    for layer in reversed(range(len(sizes) - 1)):
        if (stop - offsets[layer]) * itemsize >= bucket_bytes or layer == 0:
            buckets.append(Bucket(offsets[layer], stop, layer))
            stop = offsets[layer]
    return buckets
