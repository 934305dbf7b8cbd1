"""ZeRO stage 1: DDP with Adam's state sharded among the n ranks (FSDP shards the weights and gradients too).

The flat parameter vector, padded with zeros to a multiple of n, is cut into n shards; rank r owns shard r. Each
step, every rank (1) reduce-scatters the gradient bucket, receiving the sum over ranks of its shard only; (2) updates
that shard alone with Adam, keeping Adam's moments for it alone; (3) all-gathers the updated shards, so that all
ranks hold the new weights. A ring all-reduce is a reduce-scatter then an all-gather: (1) and (3) cost DDP's traffic.
"""
from __future__ import annotations

import numpy as np

from hpclab import comm as hcomm
from hpclab.ddp import mlp as K
from hpclab.ddp.model import EXTRA_SLOTS, unflatten
from hpclab.ddp.trainer import DDPTrainer, broadcast_parameters, check_same_model
from hpclab.mpi import MPI

cuda = K.cuda


def shard_range(n_params: int, ranks: int, rank: int) -> tuple[int, int]:
    """[lo, hi): the parameters ``rank`` owns; hi - lo is the shard size but on the last ranks, where the padding is."""
    if n_params < ranks:
        raise ValueError(f"{n_params} parameters cannot be sharded among {ranks} ranks: fewer parameters than "
                         f"ranks leaves some rank none to own; use at most {n_params} ranks, or a larger model")
    shard = -(-n_params // ranks)
    return min(rank * shard, n_params), min((rank + 1) * shard, n_params)


def pad_bucket(model, ranks: int) -> int:
    """Give ``model`` a gradient bucket whose gradients are padded with zeros to ``ranks`` equal shards (a
    reduce-scatter's length must divide), its loss slots after the padding; returns the padded length."""
    padded = -(-model.n_params // ranks) * ranks
    model.bucket = cuda.to_device(np.zeros(padded + EXTRA_SLOTS, model.dtype))
    model.grads = unflatten(model.bucket[:model.n_params], model.sizes)
    model.stat_slots = model.bucket[padded:]
    return padded


class ZeroTrainer:
    """ZeRO-1 with Adam on an :class:`hpclab.ddp.MLP`; ``step`` as :class:`DDPTrainer`'s. Call it on every rank."""

    def __init__(self, model, comm, comm_backend="auto", lr: float = 1e-3, loss: str = "mse"):
        with hcomm.step(comm, "ZeRO-1 setup"):
            self.lo, self.hi = shard_range(model.n_params, comm.size, comm.rank)
            if model.compute_dtype != model.dtype:
                raise ValueError(f"this ZeRO-1 has no mixed precision: build the MLP in one dtype (float32 or "
                                 f"float64), not {model.dtype} weights computed in {model.compute_dtype}")
        check_same_model(comm, model)
        self.model, self.comm, self.lr, self.loss, self.steps = model, comm, lr, loss, 0
        self.be = hcomm.get(comm_backend, comm) if isinstance(comm_backend, str) else comm_backend
        broadcast_parameters(self.be, model)              # one starting point, as in DDP
        self.padded = pad_bucket(model, comm.size)
        zeros = np.zeros(self.padded // comm.size, model.dtype)
        self.state = [cuda.to_device(zeros) for _ in range(2)]   # Adam's moments, of this shard only
        self.send = cuda.to_device(zeros)                        # this shard's new weights, padded: all-gathered

    def step(self, x_dev, y_dev, idx_dev, global_batch: int) -> tuple[float, float]:
        """One step on this rank's rows ``idx_dev``; returns the global batch's mean loss and correct predictions."""
        model, k, (m, v) = self.model, self.hi - self.lo, self.state
        model.batch_gradients(x_dev, y_dev, idx_dev, global_batch, self.loss)     # as in DDP
        loss, correct = self.comm.allreduce(model.stat_slots.copy_to_host(), op=MPI().SUM)   # two numbers
        grads = self.be.reduce_scatter(model.bucket[:self.padded])   # this rank's shard of the summed gradients
        if k:                                 # Adam on this rank's shard of the weights (the padding left out)
            K.adam_update(model.params[self.lo:self.hi], grads[:k], m[:k], v[:k], self.steps + 1, self.lr)
            self.send[:k].copy_to_device(model.params[self.lo:self.hi])
        model.params.copy_to_device(self.be.allgather(self.send)[:model.n_params])   # every shard, in rank order
        model.refresh_compute_copy()
        self.steps += 1
        return float(loss), float(correct)


def held_bytes(trainer) -> dict[str, int]:
    """Device bytes a trainer (ZeRO-1 or DDP) holds on this rank, by purpose: the sizes of its arrays."""
    buffer = trainer.summed if isinstance(trainer, DDPTrainer) else trainer.send
    return {"parameters": trainer.model.params.nbytes, "gradients": trainer.model.bucket.nbytes,
            "optimizer state": sum(s.nbytes for s in trainer.state), "communication buffer": buffer.nbytes}

