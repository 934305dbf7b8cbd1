"""Host-staged MPI: device -> (pinned) host -> MPI -> host -> device.

Works with any MPI and on the simulator; every message crosses PCIe twice,
which is what CUDA-aware MPI and NCCL avoid.
"""
from __future__ import annotations

import numpy as np

from .base import Backend


def _mpi_op(op):
    from mpi4py import MPI

    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


class HostStagedMPI(Backend):
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

    def _stage_out(self, dbuf, slot="send"):
        host = self._host(dbuf.shape, dbuf.dtype, slot)
        dbuf.copy_to_host(host)  # synchronous: the data is complete before MPI sees it
        return host

    def allreduce(self, buf, op="sum"):
        buf = self.to_device(buf)
        self.check_same(buf, "allreduce")
        send = self._stage_out(buf)
        recv = self._host(buf.shape, buf.dtype, "recv")
        self.comm.Allreduce(send, recv, op=_mpi_op(self.check_op(op)))
        return self.cuda.to_device(recv)

    def reduce(self, buf, root=0, op="sum"):
        buf = self.to_device(buf)
        self.check_same(buf, "reduce")
        send = self._stage_out(buf)
        recv = self._host(buf.shape, buf.dtype, "recv") if self.rank == root else None
        self.comm.Reduce(send, recv, op=_mpi_op(self.check_op(op)), root=root)
        return self.cuda.to_device(recv) if self.rank == root else buf

    def bcast(self, buf, root=0):
        buf = self.to_device(buf)
        self.check_same(buf, "bcast")
        host = self._stage_out(buf) if self.rank == root else self._host(buf.shape, buf.dtype, "send")
        self.comm.Bcast(host, root=root)
        buf.copy_to_device(host)
        return buf

    def scatter(self, buf, root=0):
        buf = self.to_device(buf)
        self.check_same(buf, "scatter")
        self.check_divisible(buf, "scatter")
        chunk = (buf.shape[0] // self.size, *buf.shape[1:])
        send = self._stage_out(buf) if self.rank == root else None
        recv = self._host(chunk, buf.dtype, "recv")
        self.comm.Scatter(send, recv, root=root)
        return self.cuda.to_device(recv)

    def gather(self, buf, root=0):
        buf = self.to_device(buf)
        self.check_same(buf, "gather")
        send = self._stage_out(buf)
        recv = self._host((self.size * buf.shape[0], *buf.shape[1:]), buf.dtype, "recv") \
            if self.rank == root else None
        self.comm.Gather(send, recv, root=root)
        return self.cuda.to_device(recv) if self.rank == root else None

    def allgather(self, buf):
        buf = self.to_device(buf)
        self.check_same(buf, "allgather")
        send = self._stage_out(buf)
        recv = self._host((self.size * buf.shape[0], *buf.shape[1:]), buf.dtype, "recv")
        self.comm.Allgather(send, recv)
        return self.cuda.to_device(recv)

    def reduce_scatter(self, buf, op="sum"):
        buf = self.to_device(buf)
        self.check_same(buf, "reduce_scatter")
        self.check_divisible(buf, "reduce_scatter")
        send = self._stage_out(buf)
        recv = self._host((buf.shape[0] // self.size, *buf.shape[1:]), buf.dtype, "recv")
        self.comm.Reduce_scatter_block(send, recv, op=_mpi_op(self.check_op(op)))
        return self.cuda.to_device(recv)

    def sendrecv(self, sendbuf, dest, source, recvbuf=None):
        """Send to ``dest`` and receive from ``source`` at once (halo exchange).

        ``dest``/``source`` may be ``MPI.PROC_NULL`` (no neighbour); then
        nothing is sent or received and ``recvbuf`` is returned unchanged.
        """
        sendbuf = self.to_device(sendbuf)
        recvbuf = recvbuf if recvbuf is not None else self.cuda.device_array_like(sendbuf)
        send = self._stage_out(sendbuf, "halo-send")
        recv = self._host(recvbuf.shape, recvbuf.dtype, "halo-recv")
        from mpi4py import MPI

        self.comm.Sendrecv(send, dest=dest, recvbuf=recv, source=source)
        if source != MPI.PROC_NULL:
            recvbuf.copy_to_device(recv)
        return recvbuf
