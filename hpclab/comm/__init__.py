"""Communication between ranks' GPUs: the backends (host-staged MPI, CUDA-aware MPI, NCCL) and
the choice among them; error propagation and decomposition are re-exported from the core
(:mod:`hpclab.errors`, :mod:`hpclab.decomp`) because every program uses them with the backends."""
from hpclab.decomp import block_counts, block_range, require_at_least
from hpclab.errors import RankError, step
from hpclab.comm.select import BACKENDS, choose, get

__all__ = ["BACKENDS", "RankError", "block_counts", "block_range", "choose", "get",
           "require_at_least", "step"]
