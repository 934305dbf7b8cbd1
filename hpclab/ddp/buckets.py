"""Gradient buckets: which parts of the flat gradient vector are all-reduced together, and when.

The backward pass writes gradients last layer first. PyTorch's DDP all-reduces buckets of about
``bucket_cap_mb`` each as soon as its last gradient is written, while the GPU goes on with earlier layers:
small buckets start sooner, but each all-reduce pays a fixed latency. Here layers (W and b) join the current
bucket, last layer first, until it holds ``bucket_bytes``. Each bucket is a contiguous range of the flat
vector; the first also carries the loss slots at its end (ready before the backward pass starts).

The first layer's gradient is written last, so its all-reduce is the one nothing hides. With
``first_layer_slices`` > 1 the backward pass writes W0's gradient in that many slices of rows, last rows
first (:meth:`hpclab.ddp.model.MLP.loss_and_gradients`), and the last bucket is cut where they meet: each
slice's all-reduce runs while the next slice is computed, and only the last one is left after the backward.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpclab.ddp.model import EXTRA_SLOTS, layer_offsets, slice_bounds


@dataclass(frozen=True)
class Bucket:
    start: int        # the range [start, stop) of the flat gradient vector (with the extra slots)
    stop: int
    ready_after: int  # the layer whose gradient completes it (the lowest-numbered layer in it)
    name: str         # what it carries: "layer 2", "layers 1-2", "layer 0 rows 0-1023"


def plan(sizes, bucket_bytes: float, itemsize: int, first_layer_slices: int = 1) -> list[Bucket]:
    """Buckets in the order the backward pass completes them."""
    if not bucket_bytes > 0:
        raise ValueError(f"the bucket size must be positive (got {bucket_bytes} bytes)")
    if int(first_layer_slices) != first_layer_slices or first_layer_slices < 1:
        raise ValueError(f"first_layer_slices must be a whole number >= 1 (got {first_layer_slices})")
    offsets = layer_offsets(sizes)          # where each layer's W starts in the flat vector, then the end
    buckets, stop, top = [], offsets[-1] + EXTRA_SLOTS, len(sizes) - 2
    for layer in reversed(range(len(sizes) - 1)):
        if (stop - offsets[layer]) * itemsize >= bucket_bytes or layer == 0:
            name = f"layer {layer}" if top == layer else f"layers {layer}-{top}"
            buckets.append(Bucket(offsets[layer], stop, layer, name))
            stop, top = offsets[layer], layer - 1
    if first_layer_slices == 1:
        return buckets
    last, width = buckets.pop(), sizes[1]
    rows = slice_bounds(sizes[0], first_layer_slices)
    for r0, r1 in reversed(list(zip(rows[:-1], rows[1:]))):
        start, stop = r0 * width, (r1 * width if r1 < sizes[0] else last.stop)
        name = f"layer 0 rows {r0}-{r1 - 1}" if r1 < sizes[0] or last.name == "layer 0" else \
            f"{last.name} (layer 0 from row {r0})"
        buckets.append(Bucket(start, stop, 0, name))
    return buckets
