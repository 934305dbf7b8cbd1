"""1 · Naive: one thread per element of C, every operand read from global memory.

The source tutorial's kernel. Thread (x, y) of the grid computes C[y, x], the dot product of row y of A and column x
of B; x runs along C's columns, so that the threads of a warp read adjacent elements of B and write adjacent elements
of C. Each multiply-add loads two numbers from global memory: the kernel waits on memory, not on arithmetic.
"""
from __future__ import annotations

from hpclab import backend
from hpclab.backend import cuda as _cuda

cuda = _cuda()  # decides GPU or simulator before numba reads its configuration

from numba import float32  # noqa: E402 - after the backend choice

BLOCK = 16          # BLOCK x BLOCK threads per block on a GPU


@cuda.jit(fastmath=True)
def naive_kernel(a, b, c):
    """c = a @ b. A grid that covers c gives every thread one element; a smaller
    one (the simulator's) makes each thread step over several."""
    x, y = cuda.grid(2)
    step_x, step_y = cuda.gridsize(2)
    for row in range(y, c.shape[0], step_y):
        for col in range(x, c.shape[1], step_x):
            s = float32(0)                 # float64 inputs widen it to float64
            for k in range(a.shape[1]):
                s += a[row, k] * b[k, col]
            c[row, col] = s


def launch(a, b, c) -> None:
    """c = a @ b on device arrays of one dtype, float32 or float64 (no checks): on a GPU one thread per
    element of c; on the simulator, where every CUDA thread is a Python thread, one block of 8 steps over c."""
    if backend.is_simulator():
        naive_kernel[(1, 1), (4, 2)](a, b, c)
        return
    m, n = c.shape
    naive_kernel[(-(-n // BLOCK), -(-m // BLOCK)), (BLOCK, BLOCK)](a, b, c)
