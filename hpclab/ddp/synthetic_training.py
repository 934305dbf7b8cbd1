"""Exercise 5's training run as one function: the program and the notebook both call it.

It runs on the communicator it is given: a notebook trains on all its engines and on a sub-communicator of one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hpclab import comm as hcomm
from hpclab.ddp.data import synthetic
from hpclab.ddp.model import MLP, count_parameters, init_parameters
from hpclab.ddp.sampler import DistributedSampler
from hpclab.ddp.trainer import DDPTrainer, replica_checksums


@dataclass
class SyntheticConfig:
    global_batch: int | None = None     # samples per step over all ranks (default 32)
    per_rank_batch: int | None = None   # instead: samples per step on each rank
    epochs: int = 3
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.0
    scale_lr: bool = False
    comm: str = "auto"
    dtype: str = "float64"              # float64 makes 1 and n ranks agree to ~1e-15
    hidden: int = 4
    samples: int = 1024
    seed: int = 0
    overlap: bool = False               # all-reduce gradient buckets during the backward pass
    bucket_mb: float = 25.0             # their size in MiB (each layer is one bucket at most sizes here)


def global_batch_for(cfg: SyntheticConfig, size: int) -> int:
    """The global batch to use on ``size`` ranks, or a ValueError naming the fix."""
    if cfg.global_batch and cfg.per_rank_batch:
        raise ValueError("give --global-batch or --per-rank-batch, not both")
    if cfg.per_rank_batch:
        batch = cfg.per_rank_batch * size
        if batch > cfg.samples:
            raise ValueError(f"--per-rank-batch {cfg.per_rank_batch} x {size} ranks = {batch} samples per step, "
                             f"more than the data set ({cfg.samples} samples); use --per-rank-batch "
                             f"{max(1, cfg.samples // size)} or less")
        return batch
    return cfg.global_batch or 32


def train_synthetic(comm, cfg: SyntheticConfig) -> dict:
    """Train the 6 -> hidden -> 2 MLP data-parallel on ``comm``; the same dict on every rank."""
    size, rank = comm.size, comm.rank
    sizes = [6, cfg.hidden, 2]
    dtype = np.dtype(cfg.dtype)
    with hcomm.step(comm, "input check"):
        global_batch = global_batch_for(cfg, size)
        sampler = DistributedSampler(cfg.samples, global_batch, rank, size, seed=cfg.seed)
        if not cfg.lr > 0 or cfg.epochs < 1:
            raise ValueError(f"--lr must be positive and --epochs at least 1 (got {cfg.lr:g} and {cfg.epochs})")
        be = hcomm.get(cfg.comm, comm)
    x, y = synthetic(cfg.samples, seed=cfg.seed)
    with hcomm.step(comm, "model setup"):
        model = MLP(sizes, dtype)
        # Each rank starts from its own random weights: rank 0's broadcast makes them equal (replicas check it).
        model.load(init_parameters(sizes, seed=cfg.seed + 7919 * rank))
        x_dev, y_dev = be.to_device(x.astype(dtype)), be.to_device(y.astype(dtype))
    trainer = DDPTrainer(model, comm, be, optimizer=cfg.optimizer, lr=cfg.lr, momentum=cfg.momentum,
                         scale_lr=cfg.scale_lr, loss="mse", overlap=cfg.overlap, bucket_mb=cfg.bucket_mb)
    losses, epoch_losses, checks = [], [], []
    for epoch in range(cfg.epochs):
        step_losses, _ = trainer.train_epoch(x_dev, y_dev, sampler, epoch)
        losses += step_losses
        epoch_losses.append(float(np.mean(step_losses)))
        checks.append(replica_checksums(comm, model))   # once per epoch, on every rank
    learned = (epoch_losses[-1] < epoch_losses[0] if len(epoch_losses) > 1 else losses[-1] < losses[0])
    return {
        "losses": losses, "epoch_losses": epoch_losses, "replicas_identical": all(c["identical"] for c in checks),
        "weight_checksums": checks[-1], "global_batch": global_batch, "per_rank_batch": sampler.per_rank,
        "steps_per_epoch": sampler.steps_per_epoch, "dropped_per_epoch": sampler.dropped, "epochs": cfg.epochs,
        "parameters": count_parameters(sizes), "sizes": sizes, "lr": trainer.lr, "comm": trainer.be.name,
        "dtype": dtype.name, "bucket_values": int(model.bucket.size), "learned": bool(learned),
        "finite": all(math.isfinite(v) for v in losses), "times_s": trainer.phases.max_over_ranks(comm),
        "weights": model.parameters_host(),
    }
