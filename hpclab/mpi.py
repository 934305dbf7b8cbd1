"""Access to MPI, with a clear message when it is missing."""
from __future__ import annotations

from contextlib import contextmanager


class MPIUnavailable(RuntimeError):
    pass


def MPI():
    """The ``mpi4py.MPI`` module, or an error that says how to get MPI."""
    try:
        from mpi4py import MPI as mpi
    except ImportError as exc:  # no mpi4py, or no MPI library behind it
        raise MPIUnavailable(
            f"MPI is not available ({exc}). Install the MPI wheel with "
            "`pip install 'hpclab[mpi]'` (gives mpiexec), or on a cluster "
            "`module load openmpi` and reinstall mpi4py against it."
        ) from exc
    return mpi


def world():
    return MPI().COMM_WORLD


@contextmanager
def first_ranks(comm, k: int):
    """The first ``k`` ranks of ``comm`` as a communicator of their own (None on the others), freed on
    leaving; every rank of ``comm`` enters. Scaling sweeps on engines run a program on 1, 2, 4 ... ranks so."""
    mpi = MPI()
    sub = comm.Split(0 if comm.rank < k else mpi.UNDEFINED, comm.rank)
    try:
        yield None if sub == mpi.COMM_NULL else sub
    finally:
        if sub != mpi.COMM_NULL:
            sub.Free()


def library() -> str:
    """One line naming the MPI library and its version."""
    return MPI().Get_library_version().replace("\x00", "").strip().splitlines()[0]


def cuda_aware() -> tuple[bool, str]:
    """Whether MPI accepts device pointers, and how we know, asked without handing MPI one (a non-CUDA-aware
    MPI segfaults on it, mpi4py #115): Open MPI and MVAPICH answer ``MPIX_Query_cuda_support()``, an MPI
    without it is taken as not CUDA-aware; ``HPCLAB_MPI_CUDA_AWARE=0|1`` overrides."""
    import ctypes
    import os

    forced = os.environ.get("HPCLAB_MPI_CUDA_AWARE")
    if forced in ("0", "1"):
        return forced == "1", "set by HPCLAB_MPI_CUDA_AWARE"
    MPI()  # loads the MPI library into the process; mpi4py may load it privately (RTLD_LOCAL): by path too
    try:
        with open("/proc/self/maps") as maps:
            loaded = sorted({line.split()[-1] for line in maps if "libmpi" in line and " /" in line})
    except OSError:
        loaded = []
    for lib in [None, *loaded]:
        try:
            query = ctypes.CDLL(lib).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        aware = bool(query())
        return aware, f"MPIX_Query_cuda_support() = {int(aware)}"
    return False, "this MPI has no MPIX_Query_cuda_support (taken as not CUDA-aware)"
