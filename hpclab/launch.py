"""Grid-stride launch shapes and index helpers shared by the elementwise kernels."""
from __future__ import annotations

from hpclab import backend
from hpclab.backend import cuda as _cuda

cuda = _cuda()


def launch_1d(total: int) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride kernel over ``total`` items. On the simulator, where switching
    between the Python threads that run CUDA threads costs more than the work, one block of at most 8."""
    if backend.is_simulator():
        return 1, max(1, min(8, total))
    threads = 256
    return max(1, min(65535, -(-total // threads))), threads


@cuda.jit(device=True)
def unravel4(e, C, H, W):
    """(n, c, h, w) of flat index ``e`` in a C-ordered (N, C, H, W) array."""
    w = e % W
    t = e // W
    h = t % H
    t = t // H
    return t // C, t % C, h, w


def launch_2d(rows: int, cols: int) -> tuple[tuple[int, int], int]:
    """(grid, threads) for a kernel that grid-strides over a rows x cols matrix: rows along the grid's y,
    columns along x (a warp's threads take consecutive columns: coalesced), blocks as wide as the
    columns rounded up to a warp, at most 256 threads."""
    if backend.is_simulator():
        return (min(2, -(-cols // 32)), min(2, rows)), 32
    threads = min(256, 32 * -(-cols // 32))
    return (min(-(-cols // threads), 1024), min(rows, 65535)), threads


MAX_THREADS = 1024          # CUDA's limit on threads per block


def full_gpu(work: int, blocks: int | None = None, threads: int | None = None) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride kernel over ``work`` items that fills the GPU: 1024 threads per block
    and 2 blocks per SM (of the shapes ``python -m benchmarks pi`` scans, the fastest on an H200), fewer for little
    work; on the simulator 2 blocks of 32. ``threads``: a power of two (tree reductions over a block halve it)."""
    if threads is None:
        threads = backend.auto_size(gpu=MAX_THREADS, sim=32)
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads per block must be a power of two from 1 to {MAX_THREADS}, not {threads}")
    if blocks is None:
        # The simulator's device reports no SMs: it counts as one.
        sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
        blocks = max(1, min(2 * sms, -(-work // threads)))
    if blocks < 1:
        raise ValueError(f"blocks must be at least 1, not {blocks}")
    return int(blocks), int(threads)
