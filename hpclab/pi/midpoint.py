"""Workshop Exercise 1 on one GPU: the midpoint rule for pi = integral over [0, 1] of 4 / (1 + x^2).

Each thread adds every ``stride``-th bin of the rank's slice (a grid-stride loop) in float64;
``block_sum`` adds the threads' sums, a tree in shared memory and one atomic per block.
``hpclab.pi.fast`` holds the same sum with one division for four bins, which the programs time.
"""
from __future__ import annotations

import numpy as np
from numba import float64, int64

from hpclab.backend import cuda as _cuda
from hpclab.launch import full_gpu
from hpclab.pi.check import MAX_BINS
from hpclab.pi.reduce import block_sum

cuda = _cuda()


@cuda.jit
def midpoint_kernel(start, count, h, out):
    """out[0] += h * sum of 4 / (1 + x^2) at the midpoints x = (i + 1/2) h of bins [start, start + count)."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = 0.0
    for i in range(start + t, start + count, stride):
        x = (i + 0.5) * h
        acc += 4.0 / (1.0 + x * x)
    block_sum(h * acc, out)


def partial_sum(start: int, stop: int, bins: int, blocks: int | None = None, threads: int | None = None,
                kernel=midpoint_kernel) -> float:
    """h * the sum of f over bins [start, stop) of ``bins`` bins over [0, 1], on this rank's GPU
    (``kernel``: any with midpoint_kernel's arguments; ``hpclab.pi.fast`` passes its own)."""
    if not 0 <= start <= stop <= bins:
        raise ValueError(f"bins [{start}, {stop}) are not inside [0, {bins})")
    if bins > MAX_BINS:
        raise ValueError(f"{bins} bins: bin midpoints are exact in float64 only below 2^52 bins")
    out = cuda.to_device(np.zeros(1, dtype=np.float64))
    if stop > start:
        b, t = full_gpu(stop - start, blocks, threads)
        kernel[b, t](int64(start), int64(stop - start), float64(1.0 / bins), out)
    return float(out.copy_to_host()[0])


def reference(start: int, stop: int, bins: int) -> float:
    """The same sum in NumPy (float64, pairwise summation)."""
    x = (np.arange(start, stop, dtype=np.float64) + 0.5) / bins
    return float(np.sum(4.0 / (1.0 + x * x)) / bins)
