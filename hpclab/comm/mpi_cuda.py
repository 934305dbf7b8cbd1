"""CUDA-aware MPI: device arrays handed straight to MPI.

mpi4py's upper-case methods accept any object with
``__cuda_array_interface__`` (Numba device arrays have one) and pass the
device pointer to MPI. A CUDA-aware MPI then moves the data itself: through
GPUDirect P2P/RDMA where the hardware allows, else by staging through host
memory inside the library. A MPI that is *not* CUDA-aware treats the pointer
as host memory and segfaults (mpi4py #115), so awareness is asked before any
device pointer is handed over (:func:`hpclab.mpi.cuda_aware`), on every rank.

MPI knows nothing of CUDA streams: the device (for ``sendrecv`` given a
stream, that stream) is synchronised before each operation so that the
kernels that wrote the data have finished.

On the simulator, "device" memory is host memory, so with
``HPCLAB_MPI_CUDA_AWARE=1`` this backend runs there too (the code path is
the real one; only the memory is not a GPU's).
"""
from __future__ import annotations

import numpy as np

from hpclab import backend
from hpclab.mpi import cuda_aware
from hpclab.errors import RankError
from hpclab.comm.mpi_common import MPIBackend

FIX = ("use --backend mpi-host (host staging; works everywhere) or nccl (on GPUs), or load an "
       "MPI built with CUDA support (e.g. Open MPI configured --with-cuda, or with UCX built with "
       "CUDA). If you know this MPI is CUDA-aware but cannot answer the query, set "
       "HPCLAB_MPI_CUDA_AWARE=1")


class CudaAwareMPI(MPIBackend):
    name = "mpi-cuda"

    def __init__(self, comm=None):
        super().__init__(comm)
        aware, how = cuda_aware()
        everyone = self.comm.allgather((aware, how))
        missing = {r: f"this MPI is not CUDA-aware ({h}); {FIX}"
                   for r, (a, h) in enumerate(everyone) if not a}
        if missing:
            raise RankError("mpi-cuda backend", missing, self.size)
        self.how = how
        self._sim = backend.is_simulator()

    def describe(self) -> str:
        return f"mpi-cuda (device pointers to MPI; {self.how})"

    def _mpi(self, buf):
        # The simulator's device arrays wrap NumPy arrays: that host memory is
        # what "device memory" is there, so MPI is given it directly.
        if buf is None or not self._sim:
            return buf
        return np.asarray(buf)

    def _before(self, stream=0) -> None:
        # MPI must not read data a kernel is still writing.
        (stream or self.cuda).synchronize()

    def _outgoing(self, dbuf, slot="send", stream=0):
        return dbuf

    def _incoming(self, shape, dtype, slot="recv", out=None):
        return out if out is not None else self.cuda.device_array(shape, dtype=dtype)

    def _arrived(self, recv, out=None, stream=0):
        return recv  # MPI wrote straight into device memory: nothing to copy
