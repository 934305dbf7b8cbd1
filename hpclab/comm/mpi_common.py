"""The collectives written once for both MPI backends.

Host-staged and CUDA-aware MPI make the same MPI calls; they differ only in
which memory MPI is handed: a (pinned) host copy of the device data, or the
device data itself. Subclasses say that through three hooks:

- ``_outgoing(dbuf, slot, stream)``: memory holding ``dbuf``'s data, for MPI to read;
- ``_incoming(shape, dtype, slot, out)``: memory for MPI to write into;
- ``_arrived(recv, out, stream)``: the device array holding what MPI wrote;
- ``_mpi(buf)``: the object mpi4py is handed for that memory.

and ``_before(stream)``, called at the start of every operation (CUDA-aware
MPI synchronises there: MPI does not know about CUDA streams). ``stream`` is
the CUDA stream whose work produced the data (0: the whole device), and the
one host-staged copies run on.
"""
from __future__ import annotations

from hpclab.comm.base import Backend


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
        buf = self.to_device(buf)
        self.check_op(op)
        if check:
            self.check_same(buf, "allreduce", out)
        self._before()
        send = self._outgoing(buf)
        recv = self._incoming(buf.shape, buf.dtype, "recv", out)
        self.comm.Allreduce(self._mpi(send), self._mpi(recv), op=mpi_op(op))
        return self._arrived(recv, out)

    def reduce(self, buf, root=0, op="sum"):
        buf = self.to_device(buf)
        self.check_op(op)
        self.check_same(buf, "reduce")
        self._before()
        send = self._outgoing(buf)
        recv = self._incoming(buf.shape, buf.dtype, "recv") if self.rank == root else None
        self.comm.Reduce(self._mpi(send), self._mpi(recv), op=mpi_op(op), root=root)
        return self._arrived(recv) if self.rank == root else buf

    def bcast(self, buf, root=0):
        """Root's ``buf`` into every rank's ``buf`` (in place, as MPI_Bcast)."""
        buf = self.to_device(buf)
        self.check_same(buf, "bcast")
        self._before()
        if self.rank == root:
            self.comm.Bcast(self._mpi(self._outgoing(buf)), root=root)
            return buf
        recv = self._incoming(buf.shape, buf.dtype, "send", out=buf)
        self.comm.Bcast(self._mpi(recv), root=root)
        return self._arrived(recv, out=buf)

    def scatter(self, buf, root=0):
        buf = self.to_device(buf)
        self.check_same(buf, "scatter")
        self.check_divisible(buf, "scatter")
        self._before()
        chunk = (buf.shape[0] // self.size, *buf.shape[1:])
        send = self._outgoing(buf) if self.rank == root else None
        recv = self._incoming(chunk, buf.dtype, "recv")
        self.comm.Scatter(self._mpi(send), self._mpi(recv), root=root)
        return self._arrived(recv)

    def gather(self, buf, root=0):
        buf = self.to_device(buf)
        self.check_same(buf, "gather")
        self._before()
        send = self._outgoing(buf)
        whole = (self.size * buf.shape[0], *buf.shape[1:])
        recv = self._incoming(whole, buf.dtype, "recv") if self.rank == root else None
        self.comm.Gather(self._mpi(send), self._mpi(recv), root=root)
        return self._arrived(recv) if self.rank == root else None

    def allgather(self, buf):
        buf = self.to_device(buf)
        self.check_same(buf, "allgather")
        self._before()
        send = self._outgoing(buf)
        recv = self._incoming((self.size * buf.shape[0], *buf.shape[1:]), buf.dtype, "recv")
        self.comm.Allgather(self._mpi(send), self._mpi(recv))
        return self._arrived(recv)

    def reduce_scatter(self, buf, op="sum"):
        buf = self.to_device(buf)
        self.check_op(op)
        self.check_same(buf, "reduce_scatter")
        self.check_divisible(buf, "reduce_scatter")
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
