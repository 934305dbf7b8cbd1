"""Small kernels that put data on each rank's GPU (notebooks 00, 01 and 05) and say hello."""
from __future__ import annotations

import numpy as np

from hpclab.backend import cuda as _cuda
from hpclab.launch import launch_1d

cuda = _cuda()


@cuda.jit
def fill_kernel(out, value, step):
    """out[i] = value + step * i, with a grid-stride loop."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] = value + step * i


@cuda.jit
def hello_kernel(out, rank):
    """Each thread writes rank * 1000 + its global thread index."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = rank * 1000 + i


def fill(n: int, value, step=0, dtype=np.float64):
    """A device array of n elements: value, value + step, value + 2 step, ..."""
    out = cuda.device_array(n, dtype=dtype)
    blocks, threads = launch_1d(n)
    fill_kernel[blocks, threads](out, dtype(value), dtype(step))
    return out


def hello(rank: int, threads: int = 8) -> np.ndarray:
    """Launch one block on this rank's GPU; returns what its threads wrote."""
    out = cuda.device_array(threads, dtype=np.int64)
    hello_kernel[1, threads](out, rank)
    return out.copy_to_host()
