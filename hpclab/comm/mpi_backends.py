"""The two MPI backends, the same MPI calls on different memory.

- ``mpi-host``: device -> (pinned) host -> MPI -> host -> device. Works with any MPI and on the
  simulator; every message crosses PCIe twice, which CUDA-aware MPI and NCCL avoid.
- ``mpi-cuda``: the device arrays themselves (a ``__cuda_array_interface__`` pointer). An MPI that is
  *not* CUDA-aware treats it as host memory and segfaults (mpi4py #115), so every rank is asked first.
  On the simulator device memory is host memory: with ``HPCLAB_MPI_CUDA_AWARE=1`` the real code path runs there.

A subclass says which memory through hooks: ``_outgoing`` (memory MPI reads a device array's data
from), ``_incoming`` (memory MPI writes into), ``_arrived`` (the device array holding what MPI wrote),
``_mpi`` (what mpi4py is handed) and ``_before`` (CUDA-aware MPI synchronises there: MPI knows nothing
of CUDA streams). ``stream``: the stream whose work produced the data (0: the whole device).
"""
from __future__ import annotations

import numpy as np

from hpclab import backend
from hpclab.comm.base import Backend
from hpclab.errors import RankError
from hpclab.mpi import MPI, cuda_aware

FIX = ("use --backend mpi-host (host staging; works everywhere) or nccl (on GPUs), or load an "
       "MPI built with CUDA support (e.g. Open MPI configured --with-cuda, or with UCX built with "
       "CUDA). If you know this MPI is CUDA-aware but cannot answer the query, set "
       "HPCLAB_MPI_CUDA_AWARE=1")


def mpi_op(op: str):
    return {"sum": MPI().SUM, "max": MPI().MAX, "min": MPI().MIN}[op]


class MPIBackend(Backend):
    def _before(self, stream=0) -> None:
        pass

    def _mpi(self, buf):
        return buf

    def _collective(self, mpi_call, buf, shape, sends=True, receives=True, out=None, **kw):
        """``mpi_call(send, recv, **kw)`` on the prepared ``buf``: the device array of ``shape`` that
        arrived, or None on a rank that receives nothing (``sends``: this rank's data is read)."""
        self._before()
        send = self._outgoing(buf) if sends else None
        recv = self._incoming(shape, buf.dtype, "recv", out) if receives else None
        mpi_call(self._mpi(send), self._mpi(recv), **kw)
        return self._arrived(recv, out) if receives else None

    def allreduce(self, buf, op="sum", out=None, check=True):
        buf = self.prepared(buf, "allreduce", op=op, out=out, check=check)
        return self._collective(self.comm.Allreduce, buf, buf.shape, out=out, op=mpi_op(op))

    def reduce(self, buf, root=0, op="sum"):
        buf = self.prepared(buf, "reduce", op=op)
        got = self._collective(self.comm.Reduce, buf, buf.shape, receives=self.rank == root, op=mpi_op(op), root=root)
        return got if self.rank == root else buf

    def bcast(self, buf, root=0):
        """Root's ``buf`` into every rank's ``buf`` (in place, as MPI_Bcast)."""
        buf = self.prepared(buf, "bcast")
        self._before()
        if self.rank == root:
            self.comm.Bcast(self._mpi(self._outgoing(buf)), root=root)
            return buf
        recv = self._incoming(buf.shape, buf.dtype, "send", out=buf)
        self.comm.Bcast(self._mpi(recv), root=root)
        return self._arrived(recv, out=buf)

    def scatter(self, buf, root=0):
        buf = self.prepared(buf, "scatter", divisible=True)
        part = (buf.shape[0] // self.size, *buf.shape[1:])
        return self._collective(self.comm.Scatter, buf, part, sends=self.rank == root, root=root)

    def gather(self, buf, root=0):
        buf = self.prepared(buf, "gather")
        whole = (self.size * buf.shape[0], *buf.shape[1:])
        return self._collective(self.comm.Gather, buf, whole, receives=self.rank == root, root=root)

    def allgather(self, buf):
        buf = self.prepared(buf, "allgather")
        return self._collective(self.comm.Allgather, buf, (self.size * buf.shape[0], *buf.shape[1:]))

    def reduce_scatter(self, buf, op="sum"):
        buf = self.prepared(buf, "reduce_scatter", op=op, divisible=True)
        part = (buf.shape[0] // self.size, *buf.shape[1:])
        return self._collective(self.comm.Reduce_scatter_block, buf, part, op=mpi_op(op))

    def sendrecv(self, sendbuf, dest, source, recvbuf=None, stream=0):
        """Send to ``dest`` and receive from ``source`` at once (halo exchange); ``MPI.PROC_NULL`` (no
        neighbour) skips that half. Only ``stream``, the one that wrote ``sendbuf``, is waited for, so
        kernels on other streams run on meanwhile."""
        sendbuf = self.to_device(sendbuf)
        recvbuf = recvbuf if recvbuf is not None else self.cuda.device_array_like(sendbuf)
        self._before(stream)
        send = self._outgoing(sendbuf, "halo-send", stream)
        recv = self._incoming(recvbuf.shape, recvbuf.dtype, "halo-recv", out=recvbuf)
        self.comm.Sendrecv(self._mpi(send), dest=dest, recvbuf=self._mpi(recv), source=source)
        if source != MPI().PROC_NULL:
            self._arrived(recv, out=recvbuf, stream=stream)
        return recvbuf


class HostStagedMPI(MPIBackend):
    name = "mpi-host"

    def __init__(self, comm=None):
        super().__init__(comm)
        self._pinned = {}

    def _host(self, shape, dtype, slot):
        # Reuse pinned buffers: page-locked allocation is slow, copies from it fast.
        key = (tuple(shape), np.dtype(dtype).str, slot)
        if key not in self._pinned:
            self._pinned[key] = self.cuda.pinned_array(shape, dtype=dtype)
        return self._pinned[key]

    def _outgoing(self, dbuf, slot="send", stream=0):
        host = self._host(dbuf.shape, dbuf.dtype, slot)
        # Behind the kernels of ``stream`` that wrote dbuf; complete before MPI sees it.
        dbuf.copy_to_host(host, stream=stream)
        if stream:
            stream.synchronize()
        return host

    def _incoming(self, shape, dtype, slot="recv", out=None):
        return self._host(shape, dtype, slot)

    def _arrived(self, recv, out=None, stream=0):
        if out is None:
            return self.cuda.to_device(recv)
        out.copy_to_device(recv, stream=stream)
        if stream:
            stream.synchronize()
        return out

    def release(self) -> None:
        self._pinned.clear()


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
        # The simulator's device arrays wrap NumPy arrays, the "device memory" MPI is given there.
        return np.asarray(buf) if self._sim and buf is not None else buf

    def _before(self, stream=0) -> None:
        # MPI must not read data a kernel is still writing.
        (stream or self.cuda).synchronize()

    def _outgoing(self, dbuf, slot="send", stream=0):
        return dbuf

    def _incoming(self, shape, dtype, slot="recv", out=None):
        return out if out is not None else self.cuda.device_array(shape, dtype=dtype)

    def _arrived(self, recv, out=None, stream=0):
        return recv  # MPI wrote straight into device memory: nothing to copy
