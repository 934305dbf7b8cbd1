"""Communication between ranks: error propagation, decomposition, backends."""
from .decomp import block_counts, block_range, require_at_least
from .errors import RankError, check, step
from .ring import ring_allreduce, ring_bytes_per_rank

BACKENDS = ("auto", "mpi-host")


def get(name: str = "auto", comm=None):
    """A communication backend by name (``auto`` picks the best available)."""
    from .mpi_host import HostStagedMPI

    if name in ("auto", "mpi-host"):
        return HostStagedMPI(comm)
    raise ValueError(f"unknown communication backend {name!r}; use one of {', '.join(BACKENDS)}")


__all__ = ["RankError", "block_counts", "block_range", "check", "get", "require_at_least",
           "ring_allreduce", "ring_bytes_per_rank", "step"]
