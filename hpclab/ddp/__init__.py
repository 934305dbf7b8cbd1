"""Data-parallel training built from hpclab's own kernels and communication backends.

- :mod:`.sampler`: which samples each rank trains on (shared shuffle, equal shares)
- :mod:`.model`: an MLP with flat parameter and gradient vectors on the GPU
- :mod:`.trainer`: broadcast, one all-reduce of the gradient bucket per step, updates,
  replica checks, loss scaling for mixed precision
- :mod:`.data`: the workshop's synthetic data and scikit-learn's digits
- :mod:`.monitor`: GPU memory and utilisation while training, and the 14 x P estimate
"""
from .model import MLP, count_parameters, init_parameters, layout
from .sampler import DistributedSampler, check_batch
from .trainer import DDPTrainer, LossScaler, broadcast_parameters, check_same_model, replica_checksums

__all__ = ["DDPTrainer", "DistributedSampler", "LossScaler", "MLP", "broadcast_parameters",
           "check_batch", "check_same_model", "count_parameters", "init_parameters", "layout",
           "replica_checksums"]
