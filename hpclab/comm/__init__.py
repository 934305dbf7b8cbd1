"""Communication between ranks: error propagation, decomposition, backends."""
from .decomp import block_counts, block_range, require_at_least
from .errors import RankError, check, step
from .ring import ring_allreduce, ring_bytes_per_rank
from .select import BACKENDS, choose, get

__all__ = ["BACKENDS", "RankError", "block_counts", "block_range", "check", "choose", "get",
           "require_at_least", "ring_allreduce", "ring_bytes_per_rank", "step"]
