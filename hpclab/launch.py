"""Grid-stride launch shapes and index helpers shared by the elementwise kernels."""
from __future__ import annotations

from hpclab import backend
from hpclab.backend import cuda as _cuda

cuda = _cuda()


def launch_1d(total: int) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride kernel over ``total`` items.

    On the simulator every CUDA thread is a Python thread: a few small blocks.
    """
    threads = 64 if backend.is_simulator() else 256
    cap = 4 if backend.is_simulator() else 65535
    return max(1, min(cap, -(-total // threads))), threads


@cuda.jit(device=True)
def unravel4(e, C, H, W):
    """(n, c, h, w) of flat index ``e`` in a C-ordered (N, C, H, W) array."""
    w = e % W
    t = e // W
    h = t % H
    t = t // H
    return t // C, t % C, h, w
