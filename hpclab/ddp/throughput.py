"""Samples per second of data-parallel training steps, and how they scale with ranks.

A step is timed as a whole and split into compute (forward and backward), comm (the gradient all-reduce)
and update; ``scaling`` measures on the first k ranks for each k: 1..n engines of one notebook, no relaunch.
"""
from __future__ import annotations

import numpy as np

from hpclab.ddp.model import MLP, init_parameters
from hpclab.ddp.trainer import DDPTrainer, random_batch
from hpclab.mpi import first_ranks
from hpclab.speedup import speedups
from hpclab.timing import Phases, wall


def classifier(comm, sizes, comm_backend="auto", mixed: bool = False, **options) -> DDPTrainer:
    """An SGD trainer of a float32 MLP classifier of widths ``sizes`` (``mixed``: float16 compute, loss scaling);
    ``options`` go to :class:`DDPTrainer`."""
    model = MLP(sizes, np.float32, np.float16 if mixed else np.float32)
    model.load(init_parameters(sizes, seed=0))
    return DDPTrainer(model, comm, comm_backend, optimizer="sgd", lr=1e-3, loss="xent", loss_scaling=mixed, **options)


def measure(trainer: DDPTrainer, global_batch: int, steps: int = 5, warmup: int = 2) -> dict:
    """Time steps of ``trainer`` on random data, the global batch split evenly among its ranks; one row, the same
    on every rank (with overlapped buckets ``comm_s`` is the all-reduce time left after the backward pass)."""
    comm = trainer.comm
    if global_batch % comm.size:
        raise ValueError(f"global batch {global_batch} does not divide among {comm.size} ranks")
    per = global_batch // comm.size
    batch = random_batch(comm, trainer.model.sizes, per)
    for _ in range(warmup):
        trainer.step(*batch, global_batch)
    trainer.phases, trainer.allreduce_busy_s, trainer.host_queue_s = Phases(sync=True), 0.0, 0.0
    _, _, slowest = wall(lambda: [trainer.step(*batch, global_batch) for _ in range(steps)], comm)
    step_s = slowest / steps
    ph = {k: v / steps for k, v in trainer.phases.max_over_ranks(comm).items()}
    total, comm_s = sum(ph.values()), ph.get("comm", 0.0)
    return {"gpus": comm.size, "parameters": trainer.model.n_params, "global_batch": global_batch,
            "per_gpu_batch": per, "comm": trainer.be.name, "step_s": step_s, "samples_per_s": global_batch / step_s,
            "compute_s": ph.get("compute", 0.0), "comm_s": comm_s, "update_s": ph.get("update", 0.0),
            "comm_share": comm_s / total if total else 0.0}


def scaling(comm, sizes, counts, global_batch: int, comm_backend="auto", **kwargs) -> list[dict]:
    """``measure`` of a :func:`classifier` on the first k ranks for each k in ``counts``, the same global batch
    split k ways (strong scaling); rows on every rank."""
    rows = []
    for k in counts:
        if not 1 <= k <= comm.size:
            raise ValueError(f"cannot use {k} ranks of {comm.size}")
        with first_ranks(comm, k) as sub:
            row = measure(classifier(sub, sizes, comm_backend), global_batch, **kwargs) if sub is not None else None
        rows.append(comm.bcast(row, root=0))
    for row, (s, e) in zip(rows, speedups([r["gpus"] for r in rows], [r["step_s"] for r in rows])):
        row.update(sweep="strong", speedup=s, efficiency=e)
    return rows


def format_rows(rows: list[dict]) -> str:
    """A table of a scaling sweep: ranks, batch, step time, samples/s, speedup, efficiency, comm share."""
    lines = [f"{'ranks':>5} {'batch':>6} {'per rank':>8} {'step ms':>9} {'samples/s':>10} "
             f"{'speedup':>8} {'efficiency':>10} {'comm share':>10}"]
    for r in rows:
        lines.append(f"{r['gpus']:>5} {r['global_batch']:>6} {r['per_gpu_batch']:>8} "
                     f"{1e3 * r['step_s']:>9.2f} {r['samples_per_s']:>10.0f} {r['speedup']:>8.2f} "
                     f"{r['efficiency']:>10.2f} {100 * r['comm_share']:>9.1f}%")
    return "\n".join(lines)
