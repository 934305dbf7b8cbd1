"""Data-parallel training built from hpclab's own kernels and communication backends.

- :mod:`.sampler`: which samples each rank trains on (shared shuffle, equal shares)
- :mod:`.model`: an MLP with flat parameter and gradient vectors on the GPU
- :mod:`.trainer`: broadcast, one all-reduce of the gradient bucket per step, updates,
  replica checks, loss scaling for mixed precision
- :mod:`.data`: the workshop's synthetic data and scikit-learn's digits
- :mod:`.synthetic_training`: Exercise 5's run (ddp-mlp) on any communicator
- :mod:`.digits`: Exercise 6's run (ddp-digits)
- :mod:`.sweep`: global batch x learning rate on digits, as a table
- :mod:`.throughput`: samples/s, compute/comm split, scaling over 1..n ranks
- :mod:`.monitor`: GPU memory and utilisation while training, and the 14 x P estimate
"""
from hpclab.ddp.model import MLP, count_parameters, flatten, init_parameters, layout, memory_breakdown, unflatten
from hpclab.ddp.sampler import DistributedSampler, check_batch
from hpclab.ddp.trainer import DDPTrainer, LossScaler, broadcast_parameters, check_same_model, replica_checksums

__all__ = ["DDPTrainer", "DistributedSampler", "LossScaler", "MLP", "broadcast_parameters",
           "check_batch", "check_same_model", "count_parameters", "flatten", "init_parameters",
           "layout", "memory_breakdown", "replica_checksums", "unflatten"]
