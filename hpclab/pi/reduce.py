"""One value per thread added over a block: a tree in shared memory, then one atomic per block."""
from __future__ import annotations

from hpclab.backend import cuda as _cuda
from hpclab.launch import MAX_THREADS

cuda = _cuda()


@cuda.jit(device=True)
def block_sum(value, out):
    """out[0] += the sum of ``value`` over the threads of this (power-of-two) block: log2(threads)
    halving steps, then one atomic by thread 0. The shared buffer takes out's type (float64 for
    the midpoint sums, uint64 for hit counts), so one function serves both."""
    buf = cuda.shared.array(MAX_THREADS, out.dtype)
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
