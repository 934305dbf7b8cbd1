"""Bands of rows of (N, C, H, W) tensors: copies between bands, and seeded data.

``copy_rows`` copies rows of one band into another (a halo packed into a message, unpacked into
the working buffer). ``hash_values`` gives pseudo-random values in [-1, 1) that depend only on the
seed and the element's global index (``splitmix``), so any rank can make its own band of an input
without the whole tensor (``benchmarks/conv.py`` makes the same bits on the GPU).
"""
from __future__ import annotations

import numpy as np

from hpclab.backend import cuda as _cuda
from hpclab.launch import launch_2d

cuda = _cuda()

# splitmix64 constants (Steele, Lea, Flood 2014)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S40 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(40)
_SCALE = np.float32(2.0 ** -23)


def splitmix(idx, seed):
    """The top 24 bits of splitmix64 of the uint64 index ``idx`` from ``seed``: on NumPy arrays, or in a
    kernel as a device function."""
    z = idx * _GOLDEN + seed
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    z = z ^ (z >> _S31)
    return z >> _S40


def hash_values(shape, seed: int, row0: int = 0, height: int | None = None) -> np.ndarray:
    """NumPy: rows [row0, row0 + shape[2]) of a seeded (N, C, height, W) tensor."""
    n, c, rows, w = shape
    height = rows if height is None else height
    ni, ci, hi, wi = np.meshgrid(np.arange(n, dtype=np.uint64), np.arange(c, dtype=np.uint64),
                                 np.arange(row0, row0 + rows, dtype=np.uint64),
                                 np.arange(w, dtype=np.uint64), indexing="ij")
    idx = ((ni * np.uint64(c) + ci) * np.uint64(height) + hi) * np.uint64(w) + wi
    return (splitmix(idx, np.uint64(seed)).astype(np.float32) * _SCALE - np.float32(1.0)).astype(np.float32)


@cuda.jit
def _copy_rows_kernel(src, s0, dst, d0, nrows):
    # One (image, channel, row) per grid row, its W floats along x: the index
    # divisions are paid once per row, not per float, and stores are coalesced.
    _, C, _, W = src.shape
    for t in range(cuda.blockIdx.y, src.shape[0] * C * nrows, cuda.gridDim.y):
        slab = t // nrows
        h = t - slab * nrows
        n = slab // C
        c = slab - n * C
        for w in range(cuda.grid(1), W, cuda.gridsize(1)):
            dst[n, c, d0 + h, w] = src[n, c, s0 + h, w]


def copy_rows(src, s0: int, dst, d0: int, nrows: int, stream=0) -> None:
    """dst[:, :, d0:d0+nrows] = src[:, :, s0:s0+nrows] on the device."""
    if nrows <= 0:
        return
    grid, threads = launch_2d(src.shape[0] * src.shape[1] * nrows, src.shape[3])
    _copy_rows_kernel[grid, threads, stream](src, s0, dst, d0, nrows)

