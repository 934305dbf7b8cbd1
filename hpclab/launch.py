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


def launch_2d(rows: int, cols: int) -> tuple[tuple[int, int], int]:
    """(grid, threads) for a kernel that grid-strides over a rows x cols matrix: rows along the
    grid's y, columns along x, so that a warp's threads take consecutive columns (coalesced).

    Blocks are as wide as the columns rounded up to a warp, at most 256 threads.
    """
    if backend.is_simulator():
        return (min(2, -(-cols // 32)), min(2, rows)), 32
    threads = min(256, 32 * -(-cols // 32))
    return (min(-(-cols // threads), 1024), min(rows, 65535)), threads
