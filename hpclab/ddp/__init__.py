"""Data-parallel training built from hpclab's own kernels and communication backends (notebook 07,
workshop Exercises 5 and 6); docs/architecture.md names each module's part."""
from hpclab.ddp.model import MLP, count_parameters, flatten, init_parameters, memory_breakdown, unflatten
from hpclab.ddp.sampler import DistributedSampler, check_batch
from hpclab.ddp.trainer import DDPTrainer, LossScaler, broadcast_parameters, replica_checksums

__all__ = ["DDPTrainer", "DistributedSampler", "LossScaler", "MLP", "broadcast_parameters", "check_batch",
           "count_parameters", "flatten", "init_parameters", "memory_breakdown", "replica_checksums", "unflatten"]
