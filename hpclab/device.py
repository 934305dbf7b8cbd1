"""Which GPU each MPI rank uses, and a table of the mapping.

The GPU index comes from the node-local rank (MPI's shared-memory split), not
the global rank: rank 5 on a node of four GPUs is local rank 1 on the second
node, so it must use GPU 1 (fbpic #523, amrex #3382).
"""
from __future__ import annotations

import socket
import warnings
from dataclasses import asdict, dataclass

from . import backend
from .mpi import world


@dataclass
class Placement:
    rank: int
    size: int
    host: str
    local_rank: int
    local_size: int
    gpu: int
    node_gpus: int
    gpu_name: str
    gpu_uuid: str

    def label(self) -> str:
        return (f"rank {self.rank}/{self.size} | local_rank {self.local_rank}/{self.local_size} "
                f"| GPU {self.gpu}")


class SharedGPUWarning(UserWarning):
    """More ranks on a node than GPUs: some ranks share a GPU."""


_placement: Placement | None = None


def local_rank(comm=None) -> tuple[int, int]:
    """(local rank, ranks on this node) from MPI's shared-memory split."""
    comm = comm or world()
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        return node.rank, node.size
    finally:
        node.Free()


def select_gpu(comm=None) -> Placement:
    """Bind this rank to GPU ``local_rank % gpus_on_node`` (once per process)."""
    global _placement
    comm = comm or world()
    if _placement is not None and _placement.size == comm.size:
        return _placement
    cuda = backend.cuda()
    lrank, lsize = local_rank(comm)
    ngpus = len(cuda.gpus)
    if ngpus == 0:
        raise backend.BackendError("no CUDA device is visible to this rank")
    gpu = lrank % ngpus
    if lsize > ngpus and comm.rank == 0 and not backend.is_simulator():
        warnings.warn(
            f"{lsize} ranks share {ngpus} GPU(s) on {socket.gethostname()}: ranks that "
            "share a GPU split its time. Start at most one rank per GPU "
            "(e.g. mpiexec -n <GPUs> or srun --ntasks-per-node=<GPUs>).",
            SharedGPUWarning, stacklevel=2)
    cuda.select_device(gpu)
    if backend.is_simulator():
        name = uuid = "simulator"
    else:
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        uuid = str(getattr(dev, "uuid", "?"))
    _placement = Placement(comm.rank, comm.size, socket.gethostname(), lrank, lsize, gpu, ngpus,
                           name, uuid)
    return _placement


def table(comm=None) -> list[dict]:
    """Every rank's placement, in rank order, on every rank."""
    comm = comm or world()
    return [asdict(p) for p in comm.allgather(select_gpu(comm))]


def format_table(rows: list[dict]) -> str:
    header = f"{'rank':>4}  {'host':<20} {'local':>5}  {'GPU':>3}  name / UUID"
    lines = [header, "-" * len(header)]
    for r in rows:
        ident = r["gpu_name"] if r["gpu_uuid"] in ("simulator", r["gpu_name"]) else f"{r['gpu_name']}  {r['gpu_uuid']}"
        lines.append(f"{r['rank']:>4}  {r['host'][:20]:<20} {r['local_rank']:>5}  {r['gpu']:>3}  {ident}")
    return "\n".join(lines)
