"""Pi two ways on one GPU: the midpoint rule and Monte Carlo (workshop Exercises 1 and 2).

Midpoint rule
    pi = integral over [0, 1] of 4 / (1 + x^2) dx, summed over bins in float64.
    Each thread takes every ``stride``-th bin of its rank's slice (grid-stride
    loop), the block adds its threads' sums in shared memory (a tree), and one
    thread per block adds the block's sum to the result with one atomic.

    Speed: the loop is bound by float64 throughput, and a float64 division
    costs about as much as ten multiply-adds. Four bins share one division:
    1/a + 1/b + 1/c + 1/d = ((a+b)cd + (c+d)ab) / (abcd), which is exact
    algebra and, with a, b, c, d in [1, 2], loses only a few rounding units.

Monte Carlo
    Sample i of seed s is the i-th output of the SplitMix64 generator seeded
    with s: ``mix64(s + (i + 1) * GAMMA)`` (Steele, Lea and Flood 2014; the
    generator passes BigCrush). Because a sample depends only on its global
    index, the hit count for samples [start, start + count) is the same for
    any launch shape and any split among ranks: the estimate depends on
    (samples, seed) alone. The workshop derives per-rank seeds instead, so its
    estimate changes with the number of ranks.

    The 64-bit output gives x (upper 32 bits) and y (lower 32 bits); the point
    is the centre of a cell of a 2^32 x 2^32 grid, ((x + 1/2) / 2^32, (y + 1/2) / 2^32),
    and it is inside the quarter circle exactly when
    (x + 1/2)^2 + (y + 1/2)^2 < 2^64, that is when x^2 + x + y^2 + y does not
    overflow 64 bits: an exact integer test, no rounding, no float conversion.

    ``count_hits_xoroshiro`` is the ``numba.cuda.random`` route for comparison:
    one xoroshiro128+ state per thread, initialised on the host (its cost is
    measured by ``xoroshiro_init_seconds``), per-rank subsequences, so its
    estimate depends on the rank count and the launch shape.
"""
from __future__ import annotations

import math
import time
import warnings

import numpy as np

from .. import backend
from ..backend import cuda as _cuda

cuda = _cuda()  # decides GPU or simulator before anything of numba loads

from numba import float64, int64, uint32, uint64  # noqa: E402

if backend.is_simulator():
    # The simulator runs kernels as Python on NumPy scalars, which warn when
    # uint64 arithmetic wraps; on a GPU the wrap is the intended mod-2^64 arithmetic.
    warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)

MAX_THREADS = 1024                        # block size limit (shared-memory array size)
GAMMA = np.uint64(0x9E3779B97F4A7C15)      # SplitMix64 increment (golden ratio * 2^64)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
S30, S27, S31, S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)
ONE = np.uint64(1)
LOW32 = np.uint64(0xFFFFFFFF)
ONE_F32 = np.float32(1.0)
SEED_LIMIT = 1 << 64                       # seeds are 0 <= seed < 2^64
LAUNCH_SAMPLES = 1 << 40                   # per launch: keeps per-thread counts in 32 bits


# ---------------------------------------------------------------- launch shapes

def _sm_count() -> int:
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def launch_shape(work: int, blocks: int | None = None, threads: int | None = None) -> tuple[int, int]:
    """(blocks, threads) for ``work`` items: a full GPU, or a tiny grid on the simulator.

    On a GPU: 256 threads per block and 8 blocks per SM (a whole number of
    waves, 2048 resident threads per SM), fewer blocks when there is little work.
    """
    if threads is None:
        threads = 32 if backend.is_simulator() else 256
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads per block must be a power of two from 1 to {MAX_THREADS}, not {threads}")
    if blocks is None:
        full = 2 if backend.is_simulator() else 8 * _sm_count()
        blocks = max(1, min(full, -(-work // threads)))
    if blocks < 1:
        raise ValueError(f"blocks must be at least 1, not {blocks}")
    return int(blocks), int(threads)


# ---------------------------------------------------------------- block reduction

@cuda.jit(device=True)
def block_sum_f64(value, out):
    """Tree sum of one float64 per thread in shared memory; thread 0 adds it to out[0]."""
    buf = cuda.shared.array(MAX_THREADS, float64)
    tid = cuda.threadIdx.x
    buf[tid] = value
    cuda.syncthreads()
    half = cuda.blockDim.x // 2
    while half > 0:
        if tid < half:
            buf[tid] += buf[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        cuda.atomic.add(out, 0, buf[0])


@cuda.jit(device=True)
def block_sum_u64(value, out):
    """Tree sum of one uint64 per thread in shared memory; thread 0 adds it to out[0]."""
    buf = cuda.shared.array(MAX_THREADS, uint64)
    tid = cuda.threadIdx.x
    buf[tid] = value
    cuda.syncthreads()
    half = cuda.blockDim.x // 2
    while half > 0:
        if tid < half:
            buf[tid] += buf[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        cuda.atomic.add(out, 0, buf[0])


# ---------------------------------------------------------------- midpoint rule

@cuda.jit
def midpoint_kernel(start, count, h, out):
    """out[0] += h * sum of 4/(1+x^2) at the midpoints of bins [start, start+count)."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = 0.0
    if t < count:
        n = (count - t + stride - 1) // stride        # bins this thread owns
        fi = float64(start + t) + 0.5                  # i + 1/2, exact below 2^52
        fs = float64(stride)
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
    block_sum_f64(4.0 * h * acc, out)


@cuda.jit
def midpoint_kernel_plain(start, count, h, out):
    """The textbook loop, one division per bin: the comparison for the benchmark."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = 0.0
    for i in range(start + t, start + count, stride):
        x = (i + 0.5) * h
        acc += 4.0 / (1.0 + x * x)
    block_sum_f64(h * acc, out)


def _check_range(start: int, stop: int, n_total: int) -> None:
    if not 0 <= start <= stop <= n_total:
        raise ValueError(f"bins [{start}, {stop}) are not inside [0, {n_total})")
    if n_total >= 1 << 52:
        raise ValueError(f"{n_total} bins: bin midpoints are exact in float64 only below 2^52 bins")


def midpoint_partial(start: int, stop: int, n_total: int, blocks: int | None = None,
                     threads: int | None = None, plain: bool = False) -> float:
    """h * sum of f(x_i) for bins i in [start, stop) of ``n_total`` bins over [0, 1]."""
    _check_range(start, stop, n_total)
    out = cuda.to_device(np.zeros(1, dtype=np.float64))
    if stop > start:
        b, t = launch_shape(stop - start, blocks, threads)
        kernel = midpoint_kernel_plain if plain else midpoint_kernel
        kernel[b, t](int64(start), int64(stop - start), float64(1.0 / n_total), out)
    return float(out.copy_to_host()[0])


def midpoint_reference(start: int, stop: int, n_total: int) -> float:
    """The same sum in NumPy (float64, pairwise summation)."""
    x = (np.arange(start, stop, dtype=np.float64) + 0.5) / n_total
    return float(np.sum(4.0 / (1.0 + x * x)) / n_total)


def midpoint_error_bound(n_total: int) -> float:
    """Truncation bound (b-a) h^2 max|f''| / 24 for f = 4/(1+x^2) on [0, 1]: max|f''| = 8."""
    h = 1.0 / n_total
    return 8.0 * h * h / 24.0


def midpoint_rounding_bound(terms_per_thread: int, blocks: int, threads: int, ranks: int) -> float:
    """A bound on float64 rounding: recursive summation of n terms errs by at most ~n*u*sum.

    n counts the longest chain of roundings: a thread's own terms (each with a
    few roundings of its own), the block's tree, the atomics of the blocks,
    the reduction over ranks; doubled for safety. u = 2^-53 and the sum is pi.
    """
    u = 2.0 ** -53
    chain = terms_per_thread + 16 + math.log2(threads) + blocks + ranks
    return 2.0 * u * math.pi * chain


# ---------------------------------------------------------------- Monte Carlo, counter-based

@cuda.jit
def splitmix_hits_kernel(start, count, seed, out):
    """out[0] += number of hits among global samples [start, start+count) of ``seed``.

    The loop body is written out without casts or device-function calls:
    that changes nothing on a GPU and makes the simulator many times faster.
    """
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    hits = uint64(0)
    if t < count:
        n = (count - t + stride - 1) // stride
        z = seed + (uint64(start + t) + ONE) * GAMMA   # generator state of this thread's first sample
        step = uint64(stride) * GAMMA
        for _ in range(n):
            m = (z ^ (z >> S30)) * MIX1                 # SplitMix64 output function
            m = (m ^ (m >> S27)) * MIX2
            m = m ^ (m >> S31)
            x = m >> S32                                # upper 32 bits
            y = m & LOW32                               # lower 32 bits
            sx = x * x + x                              # < 2^64: fits
            total = sx + (y * y + y)                    # wraps exactly when outside
            if total >= sx:
                hits += ONE
            z += step
    block_sum_u64(hits, out)


@cuda.jit(device=True)
def splitmix64(seed, i):
    """Sample i's 64-bit word for ``seed``: the SplitMix64 output mix64(seed + (i + 1) * GAMMA)."""
    z = seed + (uint64(i) + ONE) * GAMMA
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    return z ^ (z >> S31)


@cuda.jit(device=True)
def inside_quarter_circle(m):
    """True when the cell centre encoded by the 64-bit word m lies inside the quarter circle."""
    x = m >> S32
    y = m & LOW32
    sx = x * x + x
    return sx + (y * y + y) >= sx


def _check_seed(seed: int) -> None:
    if not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(f"seed {seed!r} is out of range: use a whole number from 0 to 2^64 - 1")


def count_hits(start: int, count: int, seed: int, blocks: int | None = None,
               threads: int | None = None) -> int:
    """Hits among global sample indices [start, start + count) for ``seed``.

    Independent of ``blocks``/``threads`` and of how [0, N) is split into calls.
    Large counts run as several launches of at most 2^40 samples, so a
    thread's count stays within 32 bits.
    """
    _check_seed(seed)
    if start < 0 or count < 0 or start + count > SEED_LIMIT:
        raise ValueError(f"samples [{start}, {start + count}) are not valid sample indices")
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    done = 0
    while done < count:
        chunk = min(LAUNCH_SAMPLES, count - done)
        b, t = launch_shape(chunk, blocks, threads)
        splitmix_hits_kernel[b, t](int64(start + done), int64(chunk), uint64(seed), out)
        done += chunk
    return int(out.copy_to_host()[0])


def splitmix_reference(start: int, count: int, seed: int) -> np.ndarray:
    """The generator's raw 64-bit outputs for samples [start, start+count), in NumPy."""
    i = np.arange(start, start + count, dtype=np.uint64)
    z = np.uint64(seed) + (i + ONE) * GAMMA
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    return z ^ (z >> S31)


def count_hits_reference(start: int, count: int, seed: int) -> int:
    """The hit count in exact Python-integer arithmetic: (2x+1)^2 + (2y+1)^2 < 2^66."""
    z = splitmix_reference(start, count, seed)
    x = (z >> S32).astype(object)
    y = (z & np.uint64(0xFFFFFFFF)).astype(object)
    return int(np.count_nonzero((2 * x + 1) ** 2 + (2 * y + 1) ** 2 < 1 << 66))


# ---------------------------------------------------------------- Monte Carlo, xoroshiro128+

_random = None


def _rng():
    global _random
    if _random is None:
        from numba.cuda import random as numba_random

        _random = numba_random
    return _random


def _xoroshiro_kernel():
    rng = _rng()
    uniform = rng.xoroshiro128p_uniform_float32

    @cuda.jit
    def xoroshiro_hits_kernel(states, count, out):
        t = cuda.grid(1)
        stride = cuda.gridsize(1)
        hits = uint32(0)
        if t < count:
            n = (count - t + stride - 1) // stride
            for _ in range(n):
                x = uniform(states, t)
                y = uniform(states, t)
                if x * x + y * y <= ONE_F32:           # float32 throughout, as curand in the workshop
                    hits += uint32(1)
        block_sum_u64(uint64(hits), out)

    return xoroshiro_hits_kernel


_xoro = None


def xoroshiro_states(n_states: int, seed: int, rank: int = 0):
    """One xoroshiro128+ state per thread, rank r's states 2^64 * n_states * r steps on."""
    _check_seed(seed)
    return _rng().create_xoroshiro128p_states(n_states, seed=seed, subsequence_start=rank * n_states)


def xoroshiro_init_seconds(n_states: int, seed: int = 0) -> float:
    """Host-side seconds to create ``n_states`` xoroshiro128+ states (jump-ahead on the CPU)."""
    t0 = time.perf_counter()
    states = xoroshiro_states(n_states, seed)
    cuda.synchronize()
    del states
    return time.perf_counter() - t0


def count_hits_xoroshiro(count: int, seed: int, rank: int = 0, blocks: int | None = None,
                         threads: int | None = None, states=None) -> int:
    """Hits among ``count`` samples from per-thread xoroshiro128+ streams (rank-dependent).

    Pass ``states`` (from :func:`xoroshiro_states`, one per thread) to leave
    their host-side initialisation out of a timing.
    """
    global _xoro
    if _xoro is None:
        _xoro = _xoroshiro_kernel()
    b, t = launch_shape(min(count, LAUNCH_SAMPLES), blocks, threads)
    if states is None:
        states = xoroshiro_states(b * t, seed, rank)
    if len(states) != b * t:
        raise ValueError(f"{len(states)} generator states for {b * t} threads")
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    done = 0
    while done < count:
        chunk = min(LAUNCH_SAMPLES, count - done)
        _xoro[b, t](states, int64(chunk), out)
        done += chunk
    return int(out.copy_to_host()[0])


# ---------------------------------------------------------------- statistics

P_INSIDE = math.pi / 4


def mc_standard_error(samples: int) -> float:
    """Standard error of 4 * hits / N: 4 * sqrt(p (1 - p) / N), p = pi / 4."""
    return 4.0 * math.sqrt(P_INSIDE * (1.0 - P_INSIDE) / samples)
