"""NCCL: GPU-to-GPU collectives; MPI only starts them (:func:`communicator`: Exercise 4's bootstrap).

The binding is ``cupy.cuda.nccl``: it takes raw device pointers and stream handles, so Numba arrays
work through their pointers (NVIDIA's ``nccl4py`` infers the device itself: benchmarks/HISTORY.md).

Every call is enqueued on Numba's default stream, behind the kernels that produced the data, and waits
for it, as the MPI backends do; ``sendrecv`` takes the stream that wrote its buffer instead, so a halo
exchange can run on a high-priority stream beside busy kernels (``hpclab.streams``).
"""
from __future__ import annotations

import atexit
import contextlib

import numpy as np

from hpclab import backend
from hpclab.comm.base import Backend
from hpclab.device import describe_sharing, sharing
from hpclab.errors import RankError, step
from hpclab.mpi import MPI

NEEDS_OWN_GPU = "NCCL needs one GPU per rank (it refuses two ranks of one communicator on the same device)"

INSTALL = ("install CuPy, which ships NCCL's Python binding: pip install 'hpclab[gpu]' "
           "(cupy-cuda13x; on a cluster load the CUDA module first)")
NCCL_OPS = {"sum": 0, "max": 2, "min": 3}  # ncclSum, ncclMax, ncclMin
NCCL_TYPES = {np.dtype(k): v for k, v in {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "float32": 7, "float64": 8}.items()}
_communicators: dict = {}  # id(MPI comm) -> (comm, communicator, device)


class NcclUnavailable(RuntimeError):
    """NCCL cannot run in this process."""


def load():
    """The ``cupy.cuda.nccl`` module, or :class:`NcclUnavailable` saying why and what to do."""
    if backend.is_simulator():
        raise NcclUnavailable(
            "NCCL needs real NVIDIA GPUs, and this process runs on the Numba CUDA simulator "
            "(no GPU). Use --backend mpi-host (or auto) here; use nccl on a GPU node.")
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001 - ImportError, or a CUDA library that fails to load
        raise NcclUnavailable(f"NCCL is not available: cupy.cuda.nccl does not import "
                              f"({type(exc).__name__}: {exc}); {INSTALL}") from exc
    if not getattr(nccl, "available", True):
        raise NcclUnavailable(f"NCCL is not available: CuPy is installed but found no NCCL "
                              f"library; {INSTALL}")
    return nccl


class SharedGPUError(RankError):
    """NCCL asked for on ranks that share a GPU; raised on every rank, before NCCL is touched."""

    def __init__(self, shared, size: int):
        message = (f"{describe_sharing(shared)}, and {NEEDS_OWN_GPU}. Instead use --backend auto or "
                   "mpi-host (host-staged MPI; works on a shared GPU), mpi-cuda where MPI is CUDA-aware, "
                   "or start one rank per GPU (mpiexec -n <number of GPUs>; under Slurm "
                   "--ntasks-per-node=<GPUs> --gpus-per-task=1).")
        if backend.is_simulator():
            message += " On the Numba CUDA simulator NCCL is not available at all: NCCL needs real NVIDIA GPUs."
        # The same message for every rank that shares: RankError says it once.
        super().__init__("NCCL backend", {r: message for r in sorted(r for g in shared for r in g.ranks)}, size)


def require_one_gpu_per_rank(comm) -> None:
    """Raise :class:`SharedGPUError` on every rank of ``comm`` if any two of them use one device
    (collective). NCCL would fail with NCCL_ERROR_INVALID_USAGE; this names the ranks and the fix."""
    shared = sharing(comm)
    if shared:
        raise SharedGPUError(shared, comm.size)


def available() -> tuple[bool, str]:
    """Whether NCCL can be used in this process (never raises: ``hpclab info`` reports it even where no
    backend can be chosen)."""
    try:
        nccl = load()
    except (NcclUnavailable, backend.BackendError) as exc:
        return False, str(exc)
    return True, f"NCCL {version_string(nccl)}"


def version_string(nccl) -> str:
    v = nccl.get_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def unique_id(comm):
    """Rank 0's NCCL unique id, broadcast over MPI: the same 128 bytes on every rank."""
    nccl = load()
    uid = nccl.get_unique_id() if comm.rank == 0 else None
    return comm.bcast(uid, root=0)


def stream_handle(stream) -> int:
    """The integer CUDA stream handle of a Numba stream (0: legacy default stream)."""
    handle = getattr(stream, "handle", stream)
    try:
        return int(handle or 0)
    except TypeError:  # a ctypes c_void_p
        return int(getattr(handle, "value", None) or 0)


def pointer(buf) -> int:
    """Device address of a Numba device array (0 for an empty one)."""
    return buf.device_ctypes_pointer.value or 0


def communicator(comm):
    """This rank's NCCL communicator over the ranks of ``comm``, on its current GPU (the one
    ``hpclab.device.select_gpu`` chose); made once, collectively, then reused."""
    if id(comm) in _communicators:
        return _communicators[id(comm)][1:]
    with step(comm, "NCCL availability"):
        nccl = load()
        from cupy.cuda import runtime

        device = backend.cuda().get_current_device().id
        runtime.setDevice(device)  # NCCL creates the communicator on the runtime's current device
    uid = unique_id(comm)
    with step(comm, "NCCL communicator creation"):
        nccomm = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        if nccomm.device_id() != device:
            raise RuntimeError(f"NCCL put this rank's communicator on GPU {nccomm.device_id()} "
                               f"but the rank uses GPU {device}")
    _communicators[id(comm)] = (comm, nccomm, device)
    return nccomm, device


@atexit.register
def destroy_all() -> None:
    """Destroy the communicators made here, oldest first: destroying may wait for the node's other
    ranks, so every rank keeps the same order; at exit this runs before CUDA and MPI go away."""
    while _communicators:
        _, nccomm, _ = _communicators.pop(next(iter(_communicators)))
        with contextlib.suppress(Exception):  # nothing useful to do at exit
            nccomm.destroy()


class NcclBackend(Backend):
    name = "nccl"

    def __init__(self, comm=None):
        super().__init__(comm)
        require_one_gpu_per_rank(self.comm)    # before NCCL is touched: a clear refusal, not INVALID_USAGE
        with step(self.comm, "NCCL backend"):
            self._nccl = load()
        self.nccl_comm, self.device = communicator(self.comm)
        from cupy.cuda import runtime

        self._stream_obj = self.cuda.default_stream()
        self._stream = stream_handle(self._stream_obj)
        self._wait = runtime.streamSynchronize      # a raw stream handle
        self.version = version_string(self._nccl)

    def describe(self) -> str:
        return f"nccl (NCCL {self.version} via cupy.cuda.nccl, GPU {self.device})"

    def local_problem(self, buf, out=None):
        problem = super().local_problem(buf, out)
        if problem:
            return problem
        if np.dtype(buf.dtype) not in NCCL_TYPES:
            return (f"NCCL has no type for {np.dtype(buf.dtype).name}; use one of "
                    f"{', '.join(sorted(t.name for t in NCCL_TYPES))}")
        for name, a in (("buffer", buf), ("out", out)):
            if a is not None and not a.is_c_contiguous():
                return f"the {name} is not contiguous; NCCL needs contiguous memory (pass a copy)"
        return None

    def _exchange(self, transfers, stream=None) -> None:
        """NCCL's ("send" | "recv", buffer, peer) transfers in one group (no pair waits on another),
        queued on ``stream`` (a raw handle; default: the backend's), which is then waited for."""
        stream = self._stream if stream is None else stream
        self._nccl.groupStart()
        try:
            for kind, buf, peer in transfers:
                getattr(self.nccl_comm, kind)(pointer(buf), buf.size, NCCL_TYPES[buf.dtype], peer, stream)
        finally:
            self._nccl.groupEnd()
        self._wait(stream)

    def _call(self, collective: str, send, recv, *args) -> None:
        """NCCL's ``collective`` from ``send`` into ``recv`` (then ``args``) on the backend's stream, waited for."""
        getattr(self.nccl_comm, collective)(pointer(send), pointer(recv), *args, self._stream)
        self._wait(self._stream)

    def allreduce(self, buf, op="sum", out=None, check=True):
        buf = self.prepared(buf, "allreduce", op=op, out=out, check=check)
        out = self.cuda.device_array(buf.shape, dtype=buf.dtype) if out is None else out
        self._call("allReduce", buf, out, buf.size, NCCL_TYPES[buf.dtype], NCCL_OPS[op])
        return out

    def allreduce_enqueue(self, buf, out, stream) -> bool:
        # ncclAllReduce on the given stream, no synchronisation: the caller orders the
        # stream after the kernels that wrote buf (an event) and waits for it when it needs out.
        self.nccl_comm.allReduce(pointer(buf), pointer(out), buf.size, NCCL_TYPES[buf.dtype], NCCL_OPS["sum"],
                                 stream_handle(stream))
        return True

    def reduce(self, buf, root=0, op="sum"):
        buf = self.prepared(buf, "reduce", op=op)
        # recvbuff matters on the root only; elsewhere a scratch buffer, so that no rank's input is written to
        out = self.cuda.device_array(buf.shape, dtype=buf.dtype)
        self._call("reduce", buf, out, buf.size, NCCL_TYPES[buf.dtype], NCCL_OPS[op], root)
        return out if self.rank == root else buf

    def bcast(self, buf, root=0):
        buf = self.prepared(buf, "bcast")
        self._call("broadcast", buf, buf, buf.size, NCCL_TYPES[buf.dtype], root)
        return buf

    def allgather(self, buf):
        buf = self.prepared(buf, "allgather")
        out = self.cuda.device_array((self.size * buf.shape[0], *buf.shape[1:]), dtype=buf.dtype)
        self._call("allGather", buf, out, buf.size, NCCL_TYPES[buf.dtype])
        return out

    def reduce_scatter(self, buf, op="sum"):
        buf = self.prepared(buf, "reduce_scatter", op=op, divisible=True)
        out = self.cuda.device_array((buf.shape[0] // self.size, *buf.shape[1:]), dtype=buf.dtype)
        self._call("reduceScatter", buf, out, out.size, NCCL_TYPES[buf.dtype], NCCL_OPS[op])
        return out

    def scatter(self, buf, root=0):
        """Root's rows split among ranks: point-to-point sends in one NCCL group."""
        buf = self.prepared(buf, "scatter", divisible=True)
        rows = buf.shape[0] // self.size
        out = self.cuda.device_array((rows, *buf.shape[1:]), dtype=buf.dtype)
        if self.rank != root:
            self._exchange([("recv", out, root)])
            return out
        out.copy_to_device(buf[root * rows:(root + 1) * rows], stream=self._stream_obj)
        self._exchange([("send", buf[r * rows:(r + 1) * rows], r) for r in range(self.size) if r != root])
        return out

    def gather(self, buf, root=0):
        """Every rank's rows, stacked on the root (None elsewhere), in one NCCL group."""
        buf = self.prepared(buf, "gather")
        rows = buf.shape[0]
        if self.rank != root:
            self._exchange([("send", buf, root)])
            return None
        out = self.cuda.device_array((self.size * rows, *buf.shape[1:]), dtype=buf.dtype)
        out[root * rows:(root + 1) * rows].copy_to_device(buf, stream=self._stream_obj)
        self._exchange([("recv", out[r * rows:(r + 1) * rows], r) for r in range(self.size) if r != root])
        return out

    def sendrecv(self, sendbuf, dest, source, recvbuf=None, stream=0):
        """Send to ``dest`` and receive from ``source`` at once, in one NCCL group (halo exchange);
        ``MPI.PROC_NULL`` skips that half. Queued on ``stream``, the stream that wrote ``sendbuf``
        (behind its kernels, without the host waiting for them), and only that stream is waited for."""
        sendbuf = self.to_device(sendbuf)
        recvbuf = recvbuf if recvbuf is not None else self.cuda.device_array_like(sendbuf)
        problem = self.local_problem(sendbuf, None) or self.local_problem(recvbuf, None)
        if problem:
            raise ValueError(f"nccl sendrecv on rank {self.rank}: {problem}")
        handle = stream_handle(stream) if stream else self._stream
        if dest == self.rank and source == self.rank:  # a ring of one: a copy
            recvbuf.copy_to_device(sendbuf, stream=stream or self._stream_obj)
            self._wait(handle)
            return recvbuf
        self._exchange([(kind, b, peer) for kind, b, peer in (("send", sendbuf, dest), ("recv", recvbuf, source))
                        if peer != MPI().PROC_NULL], handle)
        return recvbuf
