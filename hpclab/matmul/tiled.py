"""2 · Shared-memory tiles: a block of TILE x TILE threads computes a TILE x TILE tile of C.

At each step over k the block's threads copy a TILE x TILE tile of A and one of B into shared memory,
one element each, wait for one another, and multiply the two tiles from there: every element of A and B
is read from global memory once per block instead of once per thread, TILE times fewer global loads than
the naive kernel. Elements outside A or B are loaded as zeros: any shape works, no bounds check inside.
"""
from __future__ import annotations

from hpclab import backend
from hpclab.backend import cuda as _cuda

cuda = _cuda()  # decides GPU or simulator before numba reads its configuration

from numba import float32  # noqa: E402 - after the backend choice

# A shared array's shape is a compile-time constant. 32 x 32 on a GPU; on the simulator, where every
# thread is a Python thread that waits at each barrier for all the others, 16 x 16 is several times faster.
TILE = backend.auto_size(gpu=32, sim=16)


@cuda.jit(fastmath=True)
def tiled_kernel(a, b, c):
    """c = a @ b; launch TILE x TILE threads per block and blocks covering c."""
    # Thread (ty, tx) reads As[ty, k] (one word for the whole row of threads: a
    # broadcast) and Bs[k, tx] (adjacent words): no bank conflicts, no padding.
    As = cuda.shared.array((TILE, TILE), c.dtype)
    Bs = cuda.shared.array((TILE, TILE), c.dtype)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    M, N = c.shape
    K = a.shape[1]
    s = float32(0)                          # float64 tiles widen it to float64
    for k0 in range(0, K, TILE):
        if row < M and k0 + tx < K:
            As[ty, tx] = a[row, k0 + tx]
        else:
            As[ty, tx] = 0                  # outside A: adds nothing
        if k0 + ty < K and col < N:
            Bs[ty, tx] = b[k0 + ty, col]
        else:
            Bs[ty, tx] = 0
        cuda.syncthreads()                  # the tiles are complete before anyone reads them
        for k in range(TILE):
            s += As[ty, k] * Bs[k, tx]
        cuda.syncthreads()                  # everyone is done with them before they are overwritten
    if row < M and col < N:
        c[row, col] = s


def launch(a, b, c) -> None:
    """c = a @ b on device arrays of one dtype, float32 or float64 (no checks)."""
    m, n = c.shape
    tiled_kernel[(-(-n // TILE), -(-m // TILE)), (TILE, TILE)](a, b, c)
