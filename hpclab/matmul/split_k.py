"""Split-K: a product whose tiles of C are too few to fill the GPU, computed in slices of K.

A 333 x 777 output in 128 x 128 tiles is 21 blocks on a GPU of 132 SMs: 111 SMs idle while each block walks
all 9,000 steps of k. Split into S slices of K, the same tiles give 21 * S blocks; block z of a tile writes its
slice's partial sums into layer z of an S x M x N workspace, and a second kernel adds the layers in the order
0, 1, ..., S - 1, so that C's bits do not depend on which block finished first.

:func:`plan` picks the tile shape and S from a model of the GPU's waves of blocks: a block runs its slice in a
time proportional to the slice's depth (plus a fixed part: the first tile's loads and C's stores), the GPU runs
blocks spread evenly over its SMs, ``cfg.blocks_per_sm()`` at a time on each, and an SM with fewer than SATURATE
threads resident runs slower in proportion; the slices cost their workspace traffic and one more launch. Its figures were fitted to a sweep of tile shapes and slice counts
on an H200 (``python -m benchmarks matmul --splits 1,2,4,8,16``, benchmarks/HISTORY.md).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from hpclab import backend
from hpclab.backend import cuda as _cuda
from hpclab.launch import launch_1d
from hpclab.quick_launch import Launches

cuda = _cuda()

# The model's figures, from the warp kernel's records on an H200 (benchmarks/results/h200_matmul.csv):
FMA_PER_SM = 1.8e11      # multiply-adds per second and SM (about 48 TFLOP/s over 132 SMs)
FIXED_K = 32             # a block's fixed costs, in steps of k
SATURATE = 384           # threads an SM needs resident to run the kernel at full rate (fewer: in proportion)
BYTES_PER_S = 3e12       # the workspace's traffic (below the HBM's 3.4-4.8 TB/s: a sum of layers streams)
LAUNCH_S = 5e-6          # the second kernel's start
FOUR_WARPS = 0.94        # blocks of four warps against eight: more copying and barriers per product (run four-warps)
FULL_WAVES = 3           # a grid this many times the GPU's blocks at a time is left whole
MIN_SLICE = 256          # no slice of K shallower than this: its fixed costs would dominate
MAX_SPLIT = 64


def slices(k: int, bk: int, split: int) -> tuple[int, int]:
    """(slices, depth of each but the last) when k is cut into at most ``split`` slices of whole bk tiles:
    the count can come out lower (k = 9 tiles in 4 slices of 3 is 3 slices)."""
    steps = -(-k // bk)
    per = -(-steps // max(1, min(split, steps)))
    return -(-steps // per), per * bk


def seconds(m: int, n: int, k: int, cfg, split: int, sms: int) -> float:
    """The model's time of c = a @ b (m x k by k x n) in ``cfg``'s tiles, K in ``split`` slices, on ``sms`` SMs."""
    split, depth = slices(k, cfg.bk, split)
    blocks = -(-m // cfg.bm) * -(-n // cfg.bn) * split
    most = -(-blocks // sms)                                # the blocks of the busiest SM, one after another
    resident = min(most, cfg.blocks_per_sm(split > 1))      # at a time (the kernel's launch bounds)
    rate = FMA_PER_SM * min(1.0, resident * cfg.threads / SATURATE) * (1.0 if cfg.threads >= 256 else FOUR_WARPS)
    t = most * cfg.bm * cfg.bn * (min(depth, k) + FIXED_K) / rate
    if split > 1:
        t += (2 * split + 1) * m * n * 4 / BYTES_PER_S + LAUNCH_S
    return t


def plan(m: int, n: int, k: int, configs, sms: int) -> tuple[object, int]:
    """(tile shape, slices of K): ``configs[0]`` whole when its grid fills the GPU FULL_WAVES times over (the shapes
    it was tuned on, measured at 0.90-0.98 of cuBLAS), else what the model finds fastest among ``configs[1:]``
    (ties: fewer slices, then the earlier shape)."""
    first = configs[0]
    if -(-m // first.bm) * -(-n // first.bn) >= FULL_WAVES * sms * first.blocks_per_sm():
        return first, 1
    options = []
    for rank, cfg in enumerate(configs[1:] or configs):
        for split in range(1, MAX_SPLIT + 1):
            got, depth = slices(k, cfg.bk, split)
            if got != split or (split > 1 and depth < MIN_SLICE):
                continue
            options.append((seconds(m, n, k, cfg, split, sms), split, rank, cfg))
    _, split, _, cfg = min(options, key=lambda o: o[:3])
    return cfg, split


@lru_cache(maxsize=None)
def sms(device_id: int) -> int:
    """The GPU's SMs (the simulator's device reports none: one)."""
    return getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)


def _device_id() -> int:
    return getattr(cuda.get_current_device(), "id", 0)     # (the simulator's device has no id)


def current_sms() -> int:
    return sms(_device_id())


@cuda.jit
def add_layers(w, c):
    """c = w[0] + w[1] + ... + w[S - 1], in that order for every element."""
    n = c.shape[1]
    for e in range(cuda.grid(1), c.shape[0] * n, cuda.gridsize(1)):
        i, j = e // n, e % n
        total = w[0, i, j]
        for z in range(1, w.shape[0]):
            total += w[z, i, j]
        c[i, j] = total


# add(w, c, stream=...): c = the sum of w's layers, in order
add = Launches(lambda w, c, variant=None: (add_layers, *launch_1d(c.shape[0] * c.shape[1])))
# (device, stream) -> (a float32 device buffer, grown as needed; its S x M x N views, each made once, as the DDP
# trainer makes its views once: a device-array view costs the host time on every launch, benchmarks/HISTORY.md)
_workspaces: dict = {}


def workspace(split: int, m: int, n: int, stream=0):
    """An S x M x N float32 device array for the slices' partial sums, reused by the next product on this device
    and stream (products on one stream run one after another; another stream gets its own)."""
    key = (_device_id(), stream or 0)
    need = split * m * n
    buf, views = _workspaces.get(key, (None, None))
    if buf is None or buf.size < need:
        buf, views = cuda.device_array(need, dtype=np.float32), {}
        _workspaces[key] = (buf, views)
    view = views.get((split, m, n))
    if view is None:
        view = views[(split, m, n)] = buf[:need].reshape((split, m, n))
    return view


def launch(launches, a, b, c, variant: tuple, stream=0) -> None:
    """c = a @ b by ``launches`` (a kernel family's :class:`Launches`; ``variant`` names the kernel and ends in its
    slices of K): into c itself for one slice; else into this stream's workspace, a layer a slice, whose layers are
    then added into c."""
    split = variant[-1]
    if split == 1:
        launches(a, b, c, variant=variant, stream=stream)
        return
    w = workspace(split, c.shape[0], c.shape[1], stream)
    launches(a, b, w, variant=variant, stream=stream)
    add(w, c, stream=stream)


@lru_cache(maxsize=4096)
def planned(m: int, n: int, k: int, configs: tuple) -> tuple[object, int]:
    """:func:`plan` on this GPU, once per shape (a launch must cost the host microseconds, and a plan made on
    another GPU of the process is still a correct one); on the simulator, which has no SMs to fill, the first
    shape unsplit."""
    if backend.is_simulator():
        return configs[0], 1
    return plan(m, n, k, configs, current_sms())
