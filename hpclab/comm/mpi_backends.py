"""The two MPI backends, written once: host-staged MPI and CUDA-aware MPI.

Both make the same MPI calls; they differ only in which memory MPI is handed:

- ``mpi-host`` (:class:`HostStagedMPI`): device -> (pinned) host -> MPI -> host -> device.
  Works with any MPI and on the simulator; every message crosses PCIe twice, which is what
  CUDA-aware MPI and NCCL avoid.
- ``mpi-cuda`` (:class:`CudaAwareMPI`): the device arrays themselves. mpi4py's upper-case
  methods accept any object with ``__cuda_array_interface__`` and pass the device pointer to
  MPI; a CUDA-aware MPI moves the data itself (through GPUDirect P2P/RDMA where the hardware
  allows, else by staging inside the library). An MPI that is *not* CUDA-aware treats the
  pointer as host memory and segfaults (mpi4py #115), so awareness is asked first, on every
  rank (:func:`hpclab.mpi.cuda_aware`). On the simulator "device" memory is host memory, so
  with ``HPCLAB_MPI_CUDA_AWARE=1`` this backend runs there too (the code path is the real one).

:class:`MPIBackend` holds the operations; a subclass says which memory through hooks:
``_outgoing`` (memory holding a device array's data, for MPI to read), ``_incoming`` (memory
for MPI to write into), ``_arrived`` (the device array holding what MPI wrote), ``_mpi`` (the
object mpi4py is handed for that memory) and ``_before`` (called first: CUDA-aware MPI
synchronises there, because MPI knows nothing of CUDA streams). ``stream`` is the CUDA stream
whose work produced the data (0: the whole device), and the one host-staged copies run on.
"""
from __future__ import annotations

import numpy as np

from hpclab import backend
from hpclab.comm.base import Backend
from hpclab.errors import RankError
from hpclab.mpi import cuda_aware

FIX = ("use --backend mpi-host (host staging; works everywhere) or nccl (on GPUs), or load an "
       "MPI built with CUDA support (e.g. Open MPI configured --with-cuda, or with UCX built with "
       "CUDA). If you know this MPI is CUDA-aware but cannot answer the query, set "
       "HPCLAB_MPI_CUDA_AWARE=1")


def mpi_op(op: str):
    from mpi4py import MPI

    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


class MPIBackend(Backend):
    # -- hooks ----------------------------------------------------------------
    def _before(self, stream=0) -> None:
        pass

    def _outgoing(self, dbuf, slot="send", stream=0):
        raise NotImplementedError

    def _incoming(self, shape, dtype, slot="recv", out=None):
        raise NotImplementedError

    def _arrived(self, recv, out=None, stream=0):
        raise NotImplementedError

    def _mpi(self, buf):
        return buf

    # -- the API --------------------------------------------------------------
    def allreduce(self, buf, op="sum", out=None, check=True):
        buf = self.prepared(buf, "allreduce", op=op, out=out, check=check)
        self._before()
        send = self._outgoing(buf)
        recv = self._incoming(buf.shape, buf.dtype, "recv", out)
        self.comm.Allreduce(self._mpi(send), self._mpi(recv), op=mpi_op(op))
        return self._arrived(recv, out)

    def reduce(self, buf, root=0, op="sum"):
        buf = self.prepared(buf, "reduce", op=op)
        self._before()
        send = self._outgoing(buf)
        recv = self._incoming(buf.shape, buf.dtype, "recv") if self.rank == root else None
        self.comm.Reduce(self._mpi(send), self._mpi(recv), op=mpi_op(op), root=root)
        return self._arrived(recv) if self.rank == root else buf

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
        self._before()
        chunk = (buf.shape[0] // self.size, *buf.shape[1:])
        send = self._outgoing(buf) if self.rank == root else None
        recv = self._incoming(chunk, buf.dtype, "recv")
        self.comm.Scatter(self._mpi(send), self._mpi(recv), root=root)
        return self._arrived(recv)

    def gather(self, buf, root=0):
        buf = self.prepared(buf, "gather")
        self._before()
        send = self._outgoing(buf)
        whole = (self.size * buf.shape[0], *buf.shape[1:])
        recv = self._incoming(whole, buf.dtype, "recv") if self.rank == root else None
        self.comm.Gather(self._mpi(send), self._mpi(recv), root=root)
        return self._arrived(recv) if self.rank == root else None

    def allgather(self, buf):
        buf = self.prepared(buf, "allgather")
        self._before()
        send = self._outgoing(buf)
        recv = self._incoming((self.size * buf.shape[0], *buf.shape[1:]), buf.dtype, "recv")
        self.comm.Allgather(self._mpi(send), self._mpi(recv))
        return self._arrived(recv)

    def reduce_scatter(self, buf, op="sum"):
        buf = self.prepared(buf, "reduce_scatter", op=op, divisible=True)
        self._before()
        send = self._outgoing(buf)
        recv = self._incoming((buf.shape[0] // self.size, *buf.shape[1:]), buf.dtype, "recv")
        self.comm.Reduce_scatter_block(self._mpi(send), self._mpi(recv), op=mpi_op(op))
        return self._arrived(recv)

    def sendrecv(self, sendbuf, dest, source, recvbuf=None, stream=0):
        """Send to ``dest`` and receive from ``source`` at once (halo exchange).

        ``dest``/``source`` may be ``MPI.PROC_NULL`` (no neighbour); then
        nothing is sent or received and ``recvbuf`` is returned unchanged.
        ``stream``: the CUDA stream that wrote ``sendbuf``; only it is waited
        for, so kernels on other streams run on meanwhile.
        """
        from mpi4py import MPI

        sendbuf = self.to_device(sendbuf)
        recvbuf = recvbuf if recvbuf is not None else self.cuda.device_array_like(sendbuf)
        self._before(stream)
        send = self._outgoing(sendbuf, "halo-send", stream)
        recv = self._incoming(recvbuf.shape, recvbuf.dtype, "halo-recv", out=recvbuf)
        self.comm.Sendrecv(self._mpi(send), dest=dest, recvbuf=self._mpi(recv), source=source)
        if source != MPI.PROC_NULL:
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
