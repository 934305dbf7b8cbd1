"""Choosing a communication backend by name: ``get("auto" | "mpi-host" | "mpi-cuda" | "nccl")``.

``auto`` takes the fastest that works on every rank: NCCL on GPUs (when CuPy's
NCCL imports; with one rank too, so that a one-GPU baseline does not pay
for a trip through host memory that the multi-GPU runs do not make), else CUDA-aware MPI (when MPI
says it is), else host staging. On the simulator only host staging applies;
the choice and its reason are said once, by rank 0.
"""
from __future__ import annotations

import sys

from .. import backend
from ..mpi import cuda_aware, world

BACKENDS = ("auto", "mpi-host", "mpi-cuda", "nccl")
_announced = False


def choose(comm=None) -> tuple[str, str]:
    """(backend name, why) for ``auto``; collective: the same answer on every rank."""
    from mpi4py import MPI

    comm = comm or world()
    if backend.is_simulator():
        return "mpi-host", ("the Numba CUDA simulator is in use (no GPU): NCCL and CUDA-aware MPI "
                            "need real GPUs, so device data is staged through host memory")
    from .nccl import available as nccl_available

    ok, why = nccl_available()
    if comm.allreduce(ok, op=MPI.LAND):
        return "nccl", f"GPUs and NCCL on every rank ({why})"
    aware, how = cuda_aware()
    if comm.allreduce(aware, op=MPI.LAND):
        return "mpi-cuda", f"MPI is CUDA-aware on every rank ({how})"
    return "mpi-host", f"NCCL is not importable on every rank, and MPI is not CUDA-aware ({how}): staging through host memory"


def get(name: str = "auto", comm=None, quiet: bool = False):
    """A communication backend by name. Collective: call it on every rank.

    Raises ``ValueError`` for an unknown name (the same on every rank) and
    :class:`~hpclab.comm.RankError` on every rank when the backend cannot run
    here, with the reason and the fix.
    """
    global _announced
    comm = comm or world()
    key = str(name).strip().lower()
    if key not in BACKENDS:
        raise ValueError(f"unknown communication backend {name!r}; use one of {', '.join(BACKENDS)}")
    if key == "auto":
        key, why = choose(comm)
        if not quiet and not _announced and comm.rank == 0:
            print(f"hpclab communication backend: {key} ({why})", file=sys.stderr, flush=True)
        _announced = True
    if key == "mpi-host":
        from .mpi_host import HostStagedMPI

        return HostStagedMPI(comm)
    if key == "mpi-cuda":
        from .mpi_cuda import CudaAwareMPI

        return CudaAwareMPI(comm)
    from .nccl import NcclBackend

    return NcclBackend(comm)
