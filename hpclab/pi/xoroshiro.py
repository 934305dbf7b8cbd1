"""The workshop's kind of generator, for comparison (notebook 03): one xoroshiro128+ state per thread
from ``numba.cuda.random``, as curand gives each thread in the workshop's code. Rank r's states start
2^64 x n_states x r steps into the sequence, so every thread of every rank draws its own samples: the
estimate depends on the ranks and the launch shape, unlike the counter-based generator's
(:mod:`hpclab.pi.mc`). The states are made on the host, one by one.
"""
from __future__ import annotations

import warnings

import numpy as np

from hpclab.backend import cuda as _cuda
from hpclab.launch import full_gpu
from hpclab.pi.philox import check_seed
from hpclab.pi.reduce import block_sum

cuda = _cuda()

from numba.cuda.random import create_xoroshiro128p_states, xoroshiro128p_uniform_float32  # noqa: E402

# On the simulator the generator and its state set-up run on NumPy scalars, which warn when
# their uint64 arithmetic wraps, as xoroshiro128+ means it to. (On a GPU nothing warns.)
for _module in (__name__, r".*numba\.cuda\.random"):
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning, _module)

LAUNCH_SAMPLES = 1 << 40          # per launch: keeps every thread's count in 32 bits


@cuda.jit
def hits_kernel(states, count, out):
    """out[0] += hits among ``count`` samples; thread t draws its points from states[t]."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    hits = np.uint32(0)
    if t < count:
        n = (count - t + stride - 1) // stride
        for _ in range(n):
            x = xoroshiro128p_uniform_float32(states, t)
            y = xoroshiro128p_uniform_float32(states, t)
            if x * x + y * y <= np.float32(1.0):       # float32 throughout, as curand in the workshop
                hits += np.uint32(1)
    block_sum(np.uint64(hits), out)


def states(n_states: int, seed: int, rank: int = 0):
    """One xoroshiro128+ state per thread, rank r's states 2^64 * n_states * r steps on."""
    check_seed(seed)
    return create_xoroshiro128p_states(n_states, seed=seed, subsequence_start=rank * n_states)


def count_hits(count: int, seed: int, rank: int = 0, blocks: int | None = None,
               threads: int | None = None, made=None) -> int:
    """Hits among ``count`` samples of rank ``rank``'s streams (``made``: states from :func:`states`,
    one per thread, to leave their initialisation out of a timing)."""
    b, t = full_gpu(count, blocks, threads)
    if made is None:
        made = states(b * t, seed, rank)
    if len(made) != b * t:
        raise ValueError(f"{len(made)} generator states for {b * t} threads")
    out = cuda.to_device(np.zeros(1, dtype=np.uint64))
    done = 0
    while done < count:
        chunk = min(LAUNCH_SAMPLES, count - done)
        hits_kernel[b, t](made, np.int64(chunk), out)
        done += chunk
    return int(out.copy_to_host()[0])
