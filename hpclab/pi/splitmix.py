"""SplitMix64, the counter-based generator ``pi-mc`` used before Philox4x32-7: kept for the
comparison ``hpclab bench pi`` prints (6.29e11 samples/s on one H200, against Philox's 8.20e11).

Sample i of seed s is the 64-bit word mix64(s + (i + 1) * GAMMA) (Steele, Lea and Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014); x and y are its upper and
lower 32 bits, and the sample is inside when (x + 1/2)^2 + (y + 1/2)^2 < 2^64. 64-bit
arithmetic throughout: about 37 instructions per sample on sm_90, against Philox's 24.
"""
from __future__ import annotations

import warnings

import numpy as np

from hpclab.backend import cuda as _cuda
from hpclab.launch import full_gpu
from hpclab.pi.philox import check_seed
from hpclab.pi.mc import check_range
from hpclab.pi.reduce import block_sum

cuda = _cuda()

# The simulator runs this kernel on NumPy scalars, which warn when uint64 arithmetic wraps;
# the wrap is SplitMix64's arithmetic mod 2^64. (On a GPU nothing warns.)
warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning, __name__)

GAMMA = np.uint64(0x9E3779B97F4A7C15)      # the increment: 2^64 / golden ratio
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
S30, S27, S31, S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)
ONE = np.uint64(1)
LOW32 = np.uint64(0xFFFFFFFF)
LAUNCH_SAMPLES = 1 << 40                   # per launch


@cuda.jit
def hits_kernel(start, count, seed, out):
    """out[0] += number of hits among samples [start, start+count) of ``seed``."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    hits = np.uint64(0)
    if t < count:
        n = (count - t + stride - 1) // stride
        z = seed + (np.uint64(start + t) + ONE) * GAMMA   # generator state of this thread's first sample
        step = np.uint64(stride) * GAMMA
        for _ in range(n):
            m = (z ^ (z >> S30)) * MIX1                    # SplitMix64's output function
            m = (m ^ (m >> S27)) * MIX2
            m = m ^ (m >> S31)
            x = m >> S32                                   # upper 32 bits
            y = m & LOW32                                  # lower 32 bits
            sx = x * x + x                                 # < 2^64: fits
            total = sx + (y * y + y)                       # wraps exactly when outside
            if total >= sx:
                hits += ONE
            z += step
    block_sum(hits, out)


def count_hits(start: int, count: int, seed: int, blocks: int | None = None, threads: int | None = None) -> int:
    """Hits among samples [start, start + count) with SplitMix64 words."""
    check_seed(seed)
    check_range(start, count)
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    done = 0
    while done < count:
        chunk = min(LAUNCH_SAMPLES, count - done)
        b, t = full_gpu(chunk, blocks, threads)
        hits_kernel[b, t](np.int64(start + done), np.int64(chunk), np.uint64(seed), out)
        done += chunk
    return int(out.copy_to_host()[0])


def reference(start: int, count: int, seed: int) -> np.ndarray:
    """SplitMix64's 64-bit outputs mix64(seed + (i + 1) * GAMMA) for samples [start, start+count)."""
    z = np.uint64(seed) + (np.arange(start, start + count, dtype=np.uint64) + ONE) * GAMMA
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    return z ^ (z >> S31)


def count_hits_reference(start: int, count: int, seed: int) -> int:
    """The hit count in exact Python-integer arithmetic: (2x+1)^2 + (2y+1)^2 < 2^66."""
    z = reference(start, count, seed)
    x = (z >> S32).astype(object)
    y = (z & LOW32).astype(object)
    return int(np.count_nonzero((2 * x + 1) ** 2 + (2 * y + 1) ** 2 < 1 << 66))
