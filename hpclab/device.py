"""Which GPU each MPI rank uses, which ranks share one, and a table of the mapping.

The GPU is chosen by the node-local rank (MPI's shared-memory split), not the global rank: rank 5 on nodes
of four GPUs is local rank 1 of the second node (fbpic #523, amrex #3382). Sharing is decided by device
UUIDs, not indices (under Slurm's ``--gpus-per-task`` every rank sees its GPU as "GPU 0"); NCCL refuses two
ranks of one communicator on one device, so the communication backends ask :func:`sharing` first. The
simulator's one device per node is ``sim-<host>``: its ranks always share (how CI covers that path).
"""
from __future__ import annotations

import socket
import sys
from dataclasses import asdict, dataclass, field

from hpclab import backend
from hpclab.mpi import world


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
    shared_with: list[int] = field(default_factory=list)   # ranks on this rank's GPU, itself included
    max_ranks_per_gpu: int = 1                             # the most ranks on any one GPU of the job

    def label(self) -> str:
        return (f"rank {self.rank}/{self.size} | local_rank {self.local_rank}/{self.local_size} "
                f"| GPU {self.gpu}")


@dataclass
class SharedGPU:
    """One device that several ranks of a communicator use."""

    ranks: list[int]
    host: str
    gpu: int
    name: str
    uuid: str

    def describe(self) -> str:
        ranks = ", ".join(map(str, self.ranks))
        what = "the simulated device" if self.uuid.startswith("sim-") else f"{self.name}, {self.uuid}"
        return f"ranks {ranks} share GPU {self.gpu} of {self.host} ({what})"


_placement: Placement | None = None
_told = False


def local_rank(comm=None) -> tuple[int, int]:
    """(local rank, ranks on this node) from MPI's shared-memory split."""
    comm = comm or world()
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        return node.rank, node.size
    finally:
        node.Free()


def identity() -> tuple[str, str]:
    """(name, UUID) of the current device; the simulator's is ``sim-<host>``."""
    if backend.is_simulator():
        return "simulator", f"sim-{socket.gethostname()}"
    dev = backend.cuda().get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return name, str(getattr(dev, "uuid", None) or f"{socket.gethostname()}:{dev.id}")


def shared_groups(uuids: list[str]) -> list[list[int]]:
    """Ranks (indices into ``uuids``) that use the same device, for every device used by more than one."""
    groups: dict[str, list[int]] = {}
    for rank, uuid in enumerate(uuids):
        groups.setdefault(uuid, []).append(rank)
    return [ranks for ranks in groups.values() if len(ranks) > 1]


def select_gpu(comm=None) -> Placement:
    """Bind this rank to GPU ``local_rank % gpus_on_node`` (once per process). Collective."""
    global _placement, _told
    comm = comm or world()
    if _placement is not None and _placement.size == comm.size:
        return _placement
    cuda = backend.cuda()
    lrank, lsize = local_rank(comm)
    # Every rank reaches the allgather below, also one that failed here: it raises after it,
    # so a step around this call sees the same sequence of collectives on every rank.
    failure, ngpus, gpu, name, uuid = None, 0, 0, "", ""
    try:
        ngpus = len(cuda.gpus)
        if ngpus == 0:
            raise backend.BackendError("no CUDA device is visible to this rank")
        gpu = lrank % ngpus
        cuda.select_device(gpu)
        name, uuid = identity()
    except Exception as exc:  # noqa: BLE001 - re-raised below, after the collective
        failure = exc
    uuids = [u or f"failed-{r}" for r, u in enumerate(comm.allgather(uuid))]
    if failure is not None:
        raise failure
    groups = shared_groups(uuids)
    mine = next((g for g in groups if comm.rank in g), [comm.rank])
    _placement = Placement(comm.rank, comm.size, socket.gethostname(), lrank, lsize, gpu, ngpus,
                           name, uuid, mine, max((len(g) for g in groups), default=1))
    # On real GPUs rank 0 says once that ranks take turns on a GPU (timings are time sharing, not
    # scaling); on the simulator sharing is the rule and says nothing about GPUs.
    if groups and not _told and comm.rank == 0 and not backend.is_simulator():
        which = "; ".join(f"ranks {', '.join(map(str, g))} share one GPU" for g in groups)
        print(f"hpclab placement: {which}: they take turns on it (time sharing), and NCCL cannot "
              "run between them", file=sys.stderr, flush=True)
    _told = _told or comm.rank == 0
    return _placement


def sharing(comm=None) -> list[SharedGPU]:
    """The devices that more than one rank of ``comm`` uses (empty: one GPU per rank). Collective.
    Ranks are ``comm``'s own: two ranks of a four-rank job on different GPUs do not share, even if the job does."""
    comm = comm or world()
    p = _placement          # None where select_gpu has not run: then the default device
    if p is not None:
        mine = p.gpu_uuid, p.host, p.gpu, p.gpu_name
    else:
        name, uuid = identity()
        gpu = 0 if backend.is_simulator() else backend.cuda().get_current_device().id
        mine = uuid, socket.gethostname(), gpu, name
    return shared_devices(comm.allgather(mine))


def shared_devices(everyone: list[tuple[str, str, int, str]]) -> list[SharedGPU]:
    """The shared devices among every rank's (UUID, host, GPU index, name), in rank order."""
    groups = shared_groups([e[0] for e in everyone])
    return [SharedGPU(ranks, *everyone[ranks[0]][1:], everyone[ranks[0]][0]) for ranks in groups]


def describe_sharing(shared: list[SharedGPU]) -> str:
    """'ranks 0, 1 share GPU 0 of host (...)' for every shared device, joined by '; '."""
    return "; ".join(g.describe() for g in shared)


def ranks_per_gpu(comm=None) -> int:
    """The largest number of ranks of ``comm`` on one device (1: one GPU per rank). Collective."""
    return max((len(g.ranks) for g in sharing(comm)), default=1)


def table(comm=None) -> list[dict]:
    """Every rank's placement, in rank order, on every rank."""
    comm = comm or world()
    return [asdict(p) for p in comm.allgather(select_gpu(comm))]


def format_table(rows: list[dict]) -> str:
    header = f"{'rank':>4}  {'host':<20} {'local':>5}  {'GPU':>3}  {'shared with':<12}  name / UUID"
    lines = [header, "-" * len(header)]
    for r in rows:
        ident = r["gpu_name"] if r["gpu_uuid"].startswith("sim-") else f"{r['gpu_name']}  {r['gpu_uuid']}"
        others = [x for x in r.get("shared_with", []) if x != r["rank"]]
        shared = "ranks " + ",".join(map(str, others)) if others else "-"
        lines.append(f"{r['rank']:>4}  {r['host'][:20]:<20} {r['local_rank']:>5}  {r['gpu']:>3}  "
                     f"{shared:<12}  {ident}")
    return "\n".join(lines)
