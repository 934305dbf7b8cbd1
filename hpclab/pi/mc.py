"""Workshop Exercise 2 on one GPU: count the samples that fall inside the quarter circle.

Samples 2p and 2p + 1 of seed s come from call p of the counter-based generator Philox4x32-7 (Salmon,
Moraes, Dror and Shaw, SC11 2011; the family of cuRAND's, NumPy's and C++26's, Crush-resistant from 7
rounds on): the counter (p, 0, 0, 0) scrambled with the 64-bit key s into four 32-bit words, two per
sample. A sample depends only on its global index, so a count is the same for any launch shape and any
split among ranks. A point is the centre of a cell of a 2^26 x 2^26 grid, the top 26 bits x, y of its
words, inside exactly when x^2 + x + y^2 + y < 2^52: integers below 2^53, added by float64 without
rounding. ``hpclab.pi.fast.count_hits`` counts the same hits with half the generator's work per sample.
"""
from __future__ import annotations

import numpy as np

from hpclab.backend import cuda as _cuda
from hpclab.launch import full_gpu
from hpclab.pi.philox import (LOW32, PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, RADIUS2, ROUNDS, S32, SHIFT, ZERO32,
                              check_seed, count_hits_reference, philox_reference, sample_words)  # noqa: F401 (tests)
from hpclab.pi.reduce import block_sum

cuda = _cuda()


@cuda.jit(device=True)
def philox4x32(c0, c1, c2, c3, k0, k1, rounds):
    """Philox4x32-``rounds`` of the counter (c0, c1, c2, c3) with the key (k0, k1): four 32-bit words."""
    for _ in range(rounds):
        p0 = c0 * PHILOX_M0                           # 32 x 32 -> 64 bits
        p1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = (np.uint32((p1 >> S32) ^ c1 ^ k0), np.uint32(p1),
                          np.uint32((p0 >> S32) ^ c3 ^ k1), np.uint32(p0))
        k0 = np.uint32(k0 + PHILOX_W0)
        k1 = np.uint32(k1 + PHILOX_W1)
    return c0, c1, c2, c3


@cuda.jit(device=True)
def sample_inside(seed, i):
    """True when sample i of ``seed`` falls inside the quarter circle."""
    p = np.uint64(i) >> np.uint64(1)                  # samples 2p and 2p + 1: Philox call p
    x0, x1, x2, x3 = philox4x32(np.uint32(p & LOW32), np.uint32(p >> S32), ZERO32, ZERO32,
                                np.uint32(seed & LOW32), np.uint32(seed >> S32), ROUNDS)
    if i & 1:
        x0, x1 = x2, x3
    x = np.float64(x0 >> SHIFT)
    y = np.float64(x1 >> SHIFT)
    return x * x + x + (y * y + y) < RADIUS2


@cuda.jit
def hits_kernel(start, count, seed, out):
    """out[0] += the hits among samples [start, start + count) of ``seed``."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    hits = 0
    for i in range(start + t, start + count, stride):
        if sample_inside(seed, i):
            hits += 1
    block_sum(hits, out)


def count_hits(start: int, count: int, seed: int, blocks: int | None = None, threads: int | None = None) -> int:
    """Hits among the samples [start, start + count) of ``seed``, on this rank's GPU."""
    check_seed(seed)
    check_range(start, count)
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    if count:
        b, t = full_gpu(count, blocks, threads)
        hits_kernel[b, t](np.int64(start), np.int64(count), np.uint64(seed), out)
    return int(out.copy_to_host()[0])


def check_range(start: int, count: int) -> None:
    if start < 0 or count < 0 or start + count >= 1 << 63:
        raise ValueError(f"samples [{start}, {start + count}) are not valid sample indices (0 to 2^63 - 1)")
