"""Choosing a communication backend by name: ``get("auto" | "mpi-host" | "mpi-cuda" | "nccl")``.

``auto`` takes the fastest that works on every rank: NCCL on GPUs (with one rank too, so that a one-GPU
baseline does not pay for a trip through host memory that multi-GPU runs do not make), else CUDA-aware
MPI, else host staging (the only one on the simulator). Ranks that share a GPU never get NCCL (it refuses
them). Rank 0 says the choice and its reason once, in one line.
"""
from __future__ import annotations

import sys

from hpclab import backend
from hpclab.comm.mpi_backends import CudaAwareMPI, HostStagedMPI
from hpclab.comm.nccl import NEEDS_OWN_GPU, NcclBackend, available as nccl_available
from hpclab.device import describe_sharing, sharing
from hpclab.mpi import MPI, cuda_aware, world

BACKENDS = ("auto", "mpi-host", "mpi-cuda", "nccl")
_announced = False


def decide(shared, simulator: bool, nccl_ok: bool | None = None, nccl_why: str = "",
           aware: bool | None = None, how: str = "") -> tuple[str, str]:
    """(backend, why) from what every rank reported, the same answer everywhere: ``shared``, the devices several ranks
    use (:func:`hpclab.device.sharing`); ``nccl_ok``/``aware``: NCCL importable / MPI CUDA-aware on every rank."""
    if shared:
        why = f"{describe_sharing(shared)}, and {NEEDS_OWN_GPU}"
        if simulator:
            return "mpi-host", (f"{why}; the Numba CUDA simulator has neither NCCL nor CUDA-aware MPI, "
                                "so device data is staged through host memory")
        if aware:
            return "mpi-cuda", f"{why}; MPI is CUDA-aware on every rank ({how})"
        return "mpi-host", f"{why}; MPI is not CUDA-aware ({how}): staging through host memory"
    if simulator:
        return "mpi-host", ("the Numba CUDA simulator is in use (no GPU): NCCL and CUDA-aware MPI "
                            "need real GPUs, so device data is staged through host memory")
    if nccl_ok:
        return "nccl", f"GPUs and NCCL on every rank ({nccl_why})"
    if aware:
        return "mpi-cuda", f"MPI is CUDA-aware on every rank ({how})"
    return "mpi-host", (f"NCCL is not importable on every rank, and MPI is not CUDA-aware ({how}): "
                        "staging through host memory")


def choose(comm=None) -> tuple[str, str]:
    """(backend name, why) for ``auto``; collective: the same answer on every rank."""
    comm = comm or world()
    shared = sharing(comm)
    simulator = backend.is_simulator()
    nccl_ok, nccl_why, aware, how = None, "", None, ""
    if not simulator and not shared:
        ok, nccl_why = nccl_available()
        nccl_ok = comm.allreduce(ok, op=MPI().LAND)
    if not simulator and not nccl_ok:
        mine, how = cuda_aware()
        aware = comm.allreduce(mine, op=MPI().LAND)
    return decide(shared, simulator, nccl_ok, nccl_why, aware, how)


def get(name: str = "auto", comm=None, quiet: bool = False):
    """A communication backend by name (collective: call it on every rank). ``ValueError`` for an unknown
    name; :class:`~hpclab.comm.RankError` on every rank, with the reason and the fix, where it cannot run."""
    global _announced
    comm = comm or world()
    key = str(name).strip().lower()
    if key not in BACKENDS:
        raise ValueError(f"unknown communication backend {name!r}; use one of {', '.join(BACKENDS)}")
    if key == "auto":
        key, why = choose(comm)
        if not quiet and not _announced and comm.rank == 0:
            print(f"hpclab communication backend: {key}, because {why}", file=sys.stderr, flush=True)
        _announced = True
    return {"mpi-host": HostStagedMPI, "mpi-cuda": CudaAwareMPI, "nccl": NcclBackend}[key](comm)
