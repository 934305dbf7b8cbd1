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
    Samples 2p and 2p + 1 of seed s come from one call of the Philox4x32-7
    counter-based generator (Salmon, Moraes, Dror and Shaw, "Parallel random
    numbers: as easy as 1, 2, 3", SC11, 2011): the 128-bit counter (p, 0) is
    scrambled with the 64-bit key s by 7 rounds of two 32x32 -> 64-bit
    multiplications and xors, giving four 32-bit words, two per sample.
    Philox is the generator of cuRAND, NumPy, JAX and C++26's std::philox4x32
    (10 rounds there); its authors found it Crush-resistant (it passes all of
    TestU01's SmallCrush, Crush and BigCrush with many counter patterns) from
    7 rounds on, which is far more than Monte Carlo pi needs: the two
    coordinates of a point must be uniform and independent of each other and
    of other points. Because a sample depends only on its global index, the hit
    count for samples [start, start + count) is the same for any launch shape
    and any split among ranks: the estimate depends on (samples, seed) alone.
    The workshop derives per-rank seeds instead, so its estimate changes with
    the number of ranks.

    A point's coordinates are the top 26 bits x, y of its two words: the centre
    ((x + 1/2) / 2^26, (y + 1/2) / 2^26) of a cell of a 2^26 x 2^26 grid. It is
    inside the quarter circle exactly when x^2 + x + y^2 + y < 2^52. Every value
    in that sum is an integer below 2^53, so float64 computes it without any
    rounding: an exact test, on the float64 units, which the generator's
    integer multiplications leave idle. (Counting cell centres instead of
    points of the continuous square changes p = pi/4 by a relative amount of
    order 1e-11 or less, far under the statistical error of any feasible run.)

    Speed (sm_90 machine code of the loop, two samples per iteration): 49
    instructions, 24.5 per sample, of which 6 are 32x32 -> 64-bit multiplies;
    the SplitMix64 kernel it replaces (``count_hits_splitmix``, kept for the
    benchmark) needs 37 per sample with 64-bit multiplies and shifts made of
    32-bit pieces, and ran at 6.3e11 samples/s on an H200.

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

from hpclab import backend
from hpclab.backend import cuda as _cuda

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
# Philox4x32 (Salmon, Moraes, Dror and Shaw 2011; the constants of Random123 and C++26 std::philox4x32)
ROUNDS = 7                                 # the fewest rounds the authors found Crush-resistant
PHILOX_M0, PHILOX_M1 = np.uint32(0xD2511F53), np.uint32(0xCD9E8D57)
PHILOX_W0, PHILOX_W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
ZERO32, ONE32 = np.uint32(0), np.uint32(1)
SHIFT = np.uint32(6)                       # coordinates: the top 26 bits of a 32-bit word
RADIUS2 = float(1 << 52)                   # inside when x^2 + x + y^2 + y < 2^52 (x, y < 2^26)
LAUNCH_PAIRS = 1 << 31                     # Philox calls (sample pairs) per launch, at most


# ---------------------------------------------------------------- launch shapes

def _sm_count() -> int:
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def launch_shape(work: int, blocks: int | None = None, threads: int | None = None) -> tuple[int, int]:
    """(blocks, threads) for ``work`` items: a full GPU, or a tiny grid on the simulator.

    On a GPU: 1024 threads per block and 2 blocks per SM (a whole number of
    waves, 2048 resident threads per SM), fewer blocks when there is little work.
    Of the shapes `hpclab bench pi` scans, this one was fastest on an H200 for
    both kernels (Monte Carlo 8.18e11 samples/s against 7.89e11 with 256 x 8).
    """
    if threads is None:
        threads = 32 if backend.is_simulator() else 1024
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads per block must be a power of two from 1 to {MAX_THREADS}, not {threads}")
    if blocks is None:
        full = 2 if backend.is_simulator() else 2 * _sm_count()
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


# ---------------------------------------------------------------- Monte Carlo, counter-based (Philox)

if backend.is_simulator():
    @cuda.jit(device=True)
    def umulhi(a, b):
        """Upper 32 bits of the 64-bit product of two 32-bit words (the simulator has no libdevice)."""
        return uint32((uint64(a) * uint64(b)) >> S32)
else:
    from numba.cuda.libdevice import umulhi  # noqa: E402  (mul.hi.u32: ptxas pairs it with the low half)


def _philox(rounds: int):
    """Philox4x32 with ``rounds`` rounds as a device function (c0, c1, c2, c3, k0, k1) -> 4 words."""
    if backend.is_simulator():
        return _philox_simulator(rounds)

    @cuda.jit(device=True)
    def philox4x32(c0, c1, c2, c3, k0, k1):
        for _ in range(rounds):
            hi0 = umulhi(c0, PHILOX_M0)
            lo0 = uint32(c0 * PHILOX_M0)
            hi1 = umulhi(c2, PHILOX_M1)
            lo1 = uint32(c2 * PHILOX_M1)
            c0, c1, c2, c3 = uint32(hi1 ^ c1 ^ k0), lo1, uint32(hi0 ^ c3 ^ k1), lo0
            k0 = uint32(k0 + PHILOX_W0)
            k1 = uint32(k1 + PHILOX_W1)
        return c0, c1, c2, c3

    return philox4x32


def _philox_simulator(rounds: int):
    """The same rounds in Python integers: the simulator runs device code as Python, and this is
    some ten times faster there than 32-bit NumPy scalars (tests compare both with the reference)."""
    m0, m1, w0, w1, low = int(PHILOX_M0), int(PHILOX_M1), int(PHILOX_W0), int(PHILOX_W1), 0xFFFFFFFF

    @cuda.jit(device=True)
    def philox4x32(c0, c1, c2, c3, k0, k1):
        c0, c1, c2, c3, k0, k1 = int(c0), int(c1), int(c2), int(c3), int(k0), int(k1)
        for _ in range(rounds):
            p0, p1 = m0 * c0, m1 * c2
            c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & low, (p0 >> 32) ^ c3 ^ k1, p0 & low
            k0, k1 = (k0 + w0) & low, (k1 + w1) & low
        return np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)

    return philox4x32


def _philox_hits_kernel(philox4x32):
    @cuda.jit
    def philox_hits_kernel(lo, pairs, hi, key0, key1, out):
        """out[0] += hits among the samples of Philox calls (hi, lo + j) for j < pairs.

        The call's 32-bit high word ``hi`` is the same for the whole launch (the
        host splits launches at multiples of 2^32 calls), so only the low word
        runs through the loop, in 32 bits; with the counter's other words zero,
        the compiler moves a round's worth of products out of the loop.
        """
        t = cuda.grid(1)
        stride = cuda.gridsize(1)
        hits = uint32(0)
        if t < pairs:
            n = uint32((pairs - t + stride - 1) // stride)
            c = uint32(lo + t)
            step = uint32(stride)
            while n != ZERO32:
                x0, x1, x2, x3 = philox4x32(c, hi, ZERO32, ZERO32, key0, key1)
                # Two points, coordinates = the top 26 bits of each word. Every value
                # below is an integer under 2^53, so the float64 arithmetic is exact.
                fa = float64(x0 >> SHIFT)
                fb = float64(x1 >> SHIFT)
                fc = float64(x2 >> SHIFT)
                fd = float64(x3 >> SHIFT)
                hits = uint32(hits + uint32(fa * fa + fa + (fb * fb + fb) < RADIUS2)
                              + uint32(fc * fc + fc + (fd * fd + fd) < RADIUS2))
                c = uint32(c + step)
                n = uint32(n - ONE32)
        block_sum_u64(uint64(hits), out)

    return philox_hits_kernel


_PHILOX: dict[int, tuple] = {}


def _philox_pair(rounds: int):
    """(device function, hits kernel) for Philox4x32 with ``rounds`` rounds, built once."""
    if rounds not in _PHILOX:
        f = _philox(rounds)
        _PHILOX[rounds] = (f, _philox_hits_kernel(f))
    return _PHILOX[rounds]


philox4x32 = _philox_pair(ROUNDS)[0]


@cuda.jit(device=True)
def sample_inside(seed, i):
    """True when sample i of ``seed`` falls inside the quarter circle (one sample, for exercises)."""
    p = uint64(i) >> ONE
    x0, x1, x2, x3 = philox4x32(uint32(p & LOW32), uint32(p >> S32), ZERO32, ZERO32,
                                uint32(seed & LOW32), uint32(seed >> S32))
    if i & 1:
        x0, x1 = x2, x3
    fa = float64(x0 >> SHIFT)
    fb = float64(x1 >> SHIFT)
    return fa * fa + fa + (fb * fb + fb) < RADIUS2


def _check_seed(seed: int) -> None:
    if not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(f"seed {seed!r} is out of range: use a whole number from 0 to 2^64 - 1")


def _check_samples(start: int, count: int) -> None:
    if start < 0 or count < 0 or start + count > SEED_LIMIT:
        raise ValueError(f"samples [{start}, {start + count}) are not valid sample indices")


def count_hits(start: int, count: int, seed: int, blocks: int | None = None,
               threads: int | None = None, rounds: int = ROUNDS) -> int:
    """Hits among global sample indices [start, start + count) for ``seed`` (Philox4x32-7).

    Independent of ``blocks``/``threads`` and of how [0, N) is split into calls.
    Samples 2p and 2p + 1 come from Philox call p; a lone sample at either
    end of the range (an odd start or stop) is counted on the host with the
    same arithmetic. ``rounds`` other than 7 is for the benchmark only.
    """
    _check_seed(seed)
    _check_samples(start, count)
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
    kernel = _philox_pair(rounds)[1]
    key0, key1 = uint32(seed & 0xFFFFFFFF), uint32(seed >> 32)
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    p = first
    while p < last:
        hi, lo = p >> 32, p & 0xFFFFFFFF
        n = min(last - p, (1 << 32) - lo, LAUNCH_PAIRS)    # never across a multiple of 2^32 calls
        b, t = launch_shape(n, blocks, threads)
        kernel[b, t](uint32(lo), uint32(n), uint32(hi), key0, key1, out)
        p += n
    return hits + int(out.copy_to_host()[0])


def philox_reference(counter, key, rounds: int = ROUNDS) -> tuple:
    """Philox4x32-``rounds`` in NumPy: counter = 4 arrays of 32-bit words, key = 2 words."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.uint64(k) for k in key)
    m0, m1, w0, w1 = (np.uint64(v) for v in (PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1))
    for _ in range(rounds):
        p0, p1 = c0 * m0, c2 * m1                            # exact: both factors < 2^32
        c0, c1, c2, c3 = (p1 >> S32) ^ c1 ^ k0, p1 & LOW32, (p0 >> S32) ^ c3 ^ k1, p0 & LOW32
        k0, k1 = (k0 + w0) & LOW32, (k1 + w1) & LOW32
    return c0, c1, c2, c3


def sample_words(start: int, count: int, seed: int, rounds: int = ROUNDS) -> tuple[np.ndarray, np.ndarray]:
    """The two 32-bit words (x, y) of samples [start, start + count), in NumPy."""
    i = np.arange(start, start + count, dtype=np.uint64)
    p = i >> ONE
    seed = int(seed)
    x0, x1, x2, x3 = philox_reference((p & LOW32, p >> S32, 0 * p, 0 * p),
                                      (seed & 0xFFFFFFFF, seed >> 32), rounds)
    odd = (i & ONE).astype(bool)
    return np.where(odd, x2, x0), np.where(odd, x3, x1)


def count_hits_reference(start: int, count: int, seed: int, rounds: int = ROUNDS) -> int:
    """The hit count in exact integer arithmetic: (2x+1)^2 + (2y+1)^2 < 2^54 on 26-bit x, y."""
    _check_seed(seed)
    x, y = (w >> np.uint64(int(SHIFT)) for w in sample_words(start, count, seed, rounds))
    x, y = x.astype(object), y.astype(object)
    return int(np.count_nonzero((2 * x + 1) ** 2 + (2 * y + 1) ** 2 < 1 << 54))


# ---------------------------------------------------------------- Monte Carlo, SplitMix64 (the previous generator)

@cuda.jit
def splitmix_hits_kernel(start, count, seed, out):
    """out[0] += number of hits among global samples [start, start+count) of ``seed`` (SplitMix64).

    Kept for the benchmark: the previous counter-based kernel, 64-bit
    arithmetic throughout (about 37 instructions per sample on sm_90).
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


def count_hits_splitmix(start: int, count: int, seed: int, blocks: int | None = None,
                        threads: int | None = None) -> int:
    """Hits among samples [start, start + count) with SplitMix64 words: (x + 1/2)^2 + (y + 1/2)^2 < 2^64."""
    _check_seed(seed)
    _check_samples(start, count)
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    done = 0
    while done < count:
        chunk = min(LAUNCH_SAMPLES, count - done)
        b, t = launch_shape(chunk, blocks, threads)
        splitmix_hits_kernel[b, t](int64(start + done), int64(chunk), uint64(seed), out)
        done += chunk
    return int(out.copy_to_host()[0])


def splitmix_reference(start: int, count: int, seed: int) -> np.ndarray:
    """SplitMix64's raw 64-bit outputs mix64(seed + (i + 1) * GAMMA) for samples [start, start+count)."""
    i = np.arange(start, start + count, dtype=np.uint64)
    z = np.uint64(seed) + (i + ONE) * GAMMA
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    return z ^ (z >> S31)


def count_hits_splitmix_reference(start: int, count: int, seed: int) -> int:
    """The SplitMix64 hit count in exact Python-integer arithmetic: (2x+1)^2 + (2y+1)^2 < 2^66."""
    z = splitmix_reference(start, count, seed)
    x = (z >> S32).astype(object)
    y = (z & LOW32).astype(object)
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
