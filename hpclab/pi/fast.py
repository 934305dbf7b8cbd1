"""The pi kernels that ``hpclab run pi-midpoint|pi-mc`` and ``python -m benchmarks pi`` time: the sums of
:mod:`hpclab.pi.midpoint` and :mod:`hpclab.pi.mc`, faster on a GPU.

Midpoint rule: the loop is bound by float64 throughput, and a division costs about ten multiply-adds.
Four bins share one: 1/a + 1/b + 1/c + 1/d = ((a+b)cd + (c+d)ab) / (abcd), exact algebra which, with
a, b, c, d in [1, 2], loses only a few rounding units.

Monte Carlo: both samples of each Philox call are used, in 32-bit words. The call's high word is the
same for the whole launch (launches split at multiples of 2^32 calls), so only the low word runs through
the loop, and with the counter's other words zero the compiler moves a round's worth of products out of
it: 48 sm_90 instructions for two samples, mc.count_hits's count bit for bit (rates: docs/results.md).
"""
from __future__ import annotations

import functools

import numpy as np

from hpclab.backend import cuda as _cuda
from hpclab.launch import full_gpu
from hpclab.pi import midpoint
from hpclab.pi.mc import check_range, philox4x32
from hpclab.pi.philox import RADIUS2, ROUNDS, SHIFT, ZERO32, check_seed, count_hits_reference
from hpclab.pi.reduce import block_sum

cuda = _cuda()

ONE32 = np.uint32(1)
LAUNCH_PAIRS = 1 << 31                     # Philox calls (sample pairs) per launch, at most


@cuda.jit
def midpoint_kernel(start, count, h, out):
    """out[0] += h * sum of 4/(1+x^2) at the midpoints of bins [start, start+count), four bins per division."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = 0.0
    if t < count:
        n = (count - t + stride - 1) // stride        # bins this thread owns
        fi = np.float64(start + t) + 0.5               # i + 1/2, exact below 2^52
        fs = np.float64(stride)
        for _ in range(n // 4):                        # four bins, one division
            xa = fi * h
            xb = (fi + fs) * h
            xc = (fi + 2.0 * fs) * h
            xd = (fi + 3.0 * fs) * h
            da = xa * xa + 1.0
            db = xb * xb + 1.0
            dc = xc * xc + 1.0
            dd = xd * xd + 1.0
            pab = da * db
            pcd = dc * dd
            acc += ((da + db) * pcd + (dc + dd) * pab) / (pab * pcd)
            fi += 4.0 * fs
        for _ in range(n % 4):
            x = fi * h
            acc += 1.0 / (x * x + 1.0)
            fi += fs
    block_sum(4.0 * h * acc, out)


def partial_sum(start: int, stop: int, bins: int, blocks: int | None = None, threads: int | None = None) -> float:
    """midpoint.partial_sum with the four-bins-per-division kernel."""
    return midpoint.partial_sum(start, stop, bins, blocks, threads, kernel=midpoint_kernel)


@functools.cache
def paired_hits_kernel(rounds: int):
    """The Monte Carlo kernel for Philox4x32-``rounds``, built per round count: the rounds are
    unrolled at compile time (7 here; 10 for the benchmark's comparison)."""

    @cuda.jit
    def hits_kernel(lo, pairs, hi, key0, key1, out):
        """out[0] += hits among the samples of Philox calls (hi, lo + j) for j < pairs."""
        t = cuda.grid(1)
        stride = cuda.gridsize(1)
        hits = np.uint32(0)
        if t < pairs:
            n = np.uint32((pairs - t + stride - 1) // stride)
            c = np.uint32(lo + t)
            step = np.uint32(stride)
            while n != ZERO32:
                x0, x1, x2, x3 = philox4x32(c, hi, ZERO32, ZERO32, key0, key1, rounds)
                # Two points, coordinates = the top 26 bits of each word. Every value
                # below is an integer under 2^53, so the float64 arithmetic is exact.
                fa = np.float64(x0 >> SHIFT)
                fb = np.float64(x1 >> SHIFT)
                fc = np.float64(x2 >> SHIFT)
                fd = np.float64(x3 >> SHIFT)
                hits = np.uint32(hits + np.uint32(fa * fa + fa + (fb * fb + fb) < RADIUS2)
                                 + np.uint32(fc * fc + fc + (fd * fd + fd) < RADIUS2))
                c = np.uint32(c + step)
                n = np.uint32(n - ONE32)
        block_sum(np.uint64(hits), out)

    return hits_kernel


def count_hits(start: int, count: int, seed: int, blocks: int | None = None,
               threads: int | None = None, rounds: int = ROUNDS) -> int:
    """Hits among samples [start, start + count) of ``seed``: mc.count_hits's count, faster. Samples
    2p and 2p + 1 come from Philox call p; a lone sample at an odd start or stop is counted on the
    host with the same arithmetic. ``rounds`` other than 7 is for the benchmark only."""
    check_seed(seed)
    check_range(start, count)
    seed = int(seed)
    stop = start + count
    first, last = (start + 1) // 2, stop // 2             # whole calls inside [start, stop)
    if first >= last:
        return count_hits_reference(start, count, seed, rounds)
    hits = 0
    if start % 2:
        hits += count_hits_reference(start, 1, seed, rounds)
    if stop % 2:
        hits += count_hits_reference(stop - 1, 1, seed, rounds)
    kernel = paired_hits_kernel(rounds)
    key0, key1 = np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32)
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    p = first
    while p < last:
        hi, lo = p >> 32, p & 0xFFFFFFFF
        n = min(last - p, (1 << 32) - lo, LAUNCH_PAIRS)    # never across a multiple of 2^32 calls
        b, t = full_gpu(n, blocks, threads)
        kernel[b, t](np.uint32(lo), np.uint32(n), np.uint32(hi), key0, key1, out)
        p += n
    return hits + int(out.copy_to_host()[0])
