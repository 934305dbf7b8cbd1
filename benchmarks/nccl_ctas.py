"""A NCCL communicator whose kernels use at most ``max_ctas`` thread blocks (CTAs), for all-reduces that run
beside compute: ``python -m benchmarks ddp --overlap-ctas N`` (:class:`HiddenAllreduce`, the DDP trainer's
``hidden_allreduce``).

NCCL picks as many CTAs (one per channel, each holding an SM for the whole collective) as give it the most
bandwidth; an all-reduce hidden behind the backward pass needs less bandwidth than that, and the SMs it holds
slow the backward pass down. ``ncclCommInitRankConfig``'s ``maxCTAs`` limits one communicator, where
``NCCL_MAX_CTAS`` or ``NCCL_MAX_NCHANNELS`` would limit every one, the all-reduces nothing hides too. CuPy does
not bind that call, so this module calls the NCCL library CuPy loaded through ctypes.
"""
from __future__ import annotations

import atexit
import ctypes

import numpy as np

from hpclab.comm.nccl import NCCL_OPS, NCCL_TYPES, load, pointer, stream_handle
from hpclab.errors import step

CONFIG_MAGIC = 0xCAFEBEEF     # NCCL_CONFIG_INITIALIZER's magic number
CONFIG_VERSION = 21700        # NCCL 2.17: the first with minCTAs/maxCTAs; later NCCLs accept this layout
UNDEFINED = -2 ** 31          # NCCL_CONFIG_UNDEF_INT: "NCCL's default"


class Config(ctypes.Structure):
    """``ncclConfig_t`` as NCCL 2.17 laid it out; NCCL reads ``size`` bytes and defaults the fields after."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int),
                ("minCTAs", ctypes.c_int), ("maxCTAs", ctypes.c_int)]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def config(max_ctas: int) -> Config:
    """The configuration of a communicator limited to ``max_ctas`` CTAs per collective."""
    if not isinstance(max_ctas, int) or not 1 <= max_ctas <= 64:
        raise ValueError(f"max_ctas must be a whole number from 1 to 64 (NCCL's most channels); got {max_ctas!r}")
    return Config(ctypes.sizeof(Config), CONFIG_MAGIC, CONFIG_VERSION, UNDEFINED, UNDEFINED, 1, max_ctas)


def library(nccl) -> ctypes.CDLL:
    """The NCCL library that ``nccl`` (the ``cupy.cuda.nccl`` module) loaded, found in this process's memory
    map, so that both bindings use one NCCL."""
    nccl.get_version()                    # makes sure the library is loaded
    try:
        with open("/proc/self/maps") as fh:
            paths = [line.split()[-1] for line in fh if "libnccl.so" in line]
    except OSError:
        paths = []
    return ctypes.CDLL(paths[0] if paths else "libnccl.so.2")


class LimitedCommunicator:
    """A second NCCL communicator over the ranks of the MPI communicator ``comm`` (collective), on the
    current GPU, limited to ``max_ctas`` CTAs per collective; ``nccl`` is the loaded ``cupy.cuda.nccl``."""

    def __init__(self, comm, max_ctas: int, nccl):
        with step(comm, f"NCCL communicator of at most {max_ctas} CTAs"):
            cfg = config(max_ctas)
            lib = self._lib = library(nccl)
            lib.ncclGetErrorString.restype = ctypes.c_char_p
            lib.ncclCommInitRankConfig.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId,
                                                   ctypes.c_int, ctypes.POINTER(Config)]
            lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                          ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
            uid = UniqueId()
            if comm.rank == 0:
                self._check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        uid = UniqueId.from_buffer_copy(comm.bcast(bytes(uid), root=0))
        self.max_ctas, self._comm = max_ctas, ctypes.c_void_p()
        with step(comm, "NCCL communicator creation (ncclCommInitRankConfig)"):
            self._check(lib.ncclCommInitRankConfig(ctypes.byref(self._comm), comm.size, uid, comm.rank,
                                                   ctypes.byref(cfg)), "ncclCommInitRankConfig")

    def _check(self, result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call} failed: {self._lib.ncclGetErrorString(result).decode()} (ncclResult {result})")

    def all_reduce(self, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> None:
        """``ncclAllReduce`` on raw device pointers, enqueued on the raw stream handle ``stream``."""
        self._check(self._lib.ncclAllReduce(send, recv, count, dtype, op, self._comm, stream or None),
                    "ncclAllReduce")

    def destroy(self) -> None:
        if self._comm:
            self._lib.ncclCommDestroy(self._comm)
            self._comm = ctypes.c_void_p()


_made: dict = {}      # (id(MPI comm), CTA limit) -> (comm, LimitedCommunicator)


def limited(be, max_ctas: int) -> LimitedCommunicator:
    """The NCCL backend ``be``'s communicator limited to ``max_ctas`` CTAs; made once, collectively, on first use,
    so every rank must ask for it at the same point."""
    key = (id(be.comm), max_ctas)
    if key not in _made:
        _made[key] = (be.comm, LimitedCommunicator(be.comm, max_ctas, load()))
    return _made[key][1]


@atexit.register
def destroy_all() -> None:
    """Destroy the limited communicators, oldest first, on every rank in the same order (before
    :func:`hpclab.comm.nccl.destroy_all`, registered earlier, runs)."""
    while _made:
        _, made = _made.pop(next(iter(_made)))
        try:
            made.destroy()
        except Exception:  # noqa: BLE001 - nothing useful to do at exit
            pass


class HiddenAllreduce:
    """The DDP trainer's ``hidden_allreduce``: with NCCL, the buckets that the backward pass hides are summed by a
    communicator of at most ``max_ctas`` CTAs (other backends run no kernels of their own: None). ``used``:
    whether a trainer took it."""

    def __init__(self, max_ctas: int):
        config(max_ctas)              # a bad limit is an error on every backend
        self.max_ctas, self.used = max_ctas, False

    def __call__(self, be):
        if be.name != "nccl":
            return None
        made, self.used = limited(be, self.max_ctas), True     # collective: when the trainer is made

        def enqueue(buf, out, stream) -> bool:
            made.all_reduce(pointer(buf), pointer(out), buf.size, NCCL_TYPES[np.dtype(buf.dtype)], NCCL_OPS["sum"],
                            stream_handle(stream))
            return True
        return enqueue
