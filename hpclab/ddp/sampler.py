"""Which samples each rank trains on: one shuffled order per epoch, shared by all ranks.

Every rank draws the same permutation (seeded by seed and epoch), cuts it into global batches and takes its
own contiguous slice of each, so the averaged gradient is what one GPU computes on the global batch. Samples
after the last full global batch are skipped that epoch (a different set each epoch).
"""
from __future__ import annotations

import numpy as np


def check_batch(n_samples: int, global_batch: int, size: int, flag: str = "--global-batch") -> int:
    """The per-rank batch, or a ValueError that says what to use instead."""
    if global_batch <= 0:
        raise ValueError(f"the global batch must be positive (got {global_batch})")
    if global_batch > n_samples:
        raise ValueError(f"global batch {global_batch} is larger than the data set ({n_samples} samples), so not "
                         f"one full batch fits; use {flag} {n_samples} or less")
    if global_batch % size:
        lower = global_batch // size * size
        options = " or ".join(str(b) for b in (lower, lower + size) if 0 < b <= n_samples)
        raise ValueError(f"global batch {global_batch} does not divide among {size} ranks ({global_batch / size:g} "
                         f"samples each); use {flag} {options} (a multiple of {size}), or --per-rank-batch to fix "
                         "each rank's share instead")
    return global_batch // size


class DistributedSampler:
    """Per-epoch sample indices for one rank (like PyTorch's, with set_epoch built in)."""

    def __init__(self, n_samples: int, global_batch: int, rank: int, size: int, seed: int = 0):
        self.per_rank = check_batch(n_samples, global_batch, size)
        self.n_samples, self.global_batch = n_samples, global_batch
        self.rank, self.size, self.seed = rank, size, seed
        self.steps_per_epoch = n_samples // global_batch
        self.dropped = n_samples - self.steps_per_epoch * global_batch

    def global_batches(self, epoch: int) -> np.ndarray:
        """(steps, global_batch) indices: the same on every rank."""
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n_samples)
        used = self.steps_per_epoch * self.global_batch
        return order[:used].reshape(self.steps_per_epoch, self.global_batch)

    def indices(self, epoch: int) -> np.ndarray:
        """(steps, per_rank) indices of this rank's share of every global batch."""
        start = self.rank * self.per_rank
        return self.global_batches(epoch)[:, start:start + self.per_rank].astype(np.int32, order="C")
