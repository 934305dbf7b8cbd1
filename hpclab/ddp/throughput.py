"""Samples per second of data-parallel training steps, and how they scale with ranks.

A step is timed as a whole and split into compute (forward and backward), comm (the gradient all-reduce)
and update; ``scaling`` measures on the first k ranks for each k: 1..n engines of one notebook, no relaunch.
"""
from __future__ import annotations

import numpy as np

from hpclab.ddp.model import MLP, init_parameters
from hpclab.ddp.trainer import DDPTrainer, random_batch
from hpclab.mpi import MPI, first_ranks
from hpclab.speedup import speedups
from hpclab.timing import Phases, wall


def measure(comm, sizes, global_batch: int, steps: int = 5, warmup: int = 2,
            precision: str = "fp32", comm_backend="auto", overlap: bool = False,
            bucket_mb: float = 25.0, first_layer_slices: int = 1, hidden_allreduce=None) -> dict:
    """Time data-parallel steps of an MLP classifier of widths ``sizes`` on random data, the global batch split
    evenly among the ranks of ``comm``; one row, the same on every rank. With ``overlap`` (buckets of
    ``bucket_mb``, the first layer's gradient in ``first_layer_slices`` slices, the trainer's
    ``hidden_allreduce``) ``comm_s`` is the all-reduce time left after the backward pass, ``allreduce_s`` the
    time the all-reduces took and ``hidden_share`` the part of it hidden behind compute."""
    size = comm.size
    if global_batch % size:
        raise ValueError(f"global batch {global_batch} does not divide among {size} ranks")
    per = global_batch // size
    mixed = precision == "mixed"
    model = MLP(sizes, np.float32, np.float16 if mixed else np.float32)
    model.load(init_parameters(sizes, seed=0))
    trainer = DDPTrainer(model, comm, comm_backend, optimizer="sgd", lr=1e-3, loss="xent",
                         loss_scaling=mixed, overlap=overlap, bucket_mb=bucket_mb,
                         first_layer_slices=first_layer_slices, hidden_allreduce=hidden_allreduce)
    batch = random_batch(comm, sizes, per)
    for _ in range(warmup):
        trainer.step(*batch, global_batch)
    trainer.phases, trainer.allreduce_busy_s = Phases(sync=True), 0.0
    _, _, slowest = wall(lambda: [trainer.step(*batch, global_batch) for _ in range(steps)], comm)
    step_s = slowest / steps
    ph = {k: v / steps for k, v in trainer.phases.max_over_ranks(comm).items()}
    # With overlap the all-reduces run during compute, so their own time is not a phase.
    busy = comm.allreduce(trainer.allreduce_busy_s, op=MPI().MAX) / steps if overlap else ph.get("comm", 0.0)
    total = sum(ph.values())
    comm_s = ph.get("comm", 0.0)
    return {"gpus": size, "parameters": model.n_params, "global_batch": global_batch, "per_gpu_batch": per,
            "precision": precision, "comm": trainer.be.name, "overlap": overlap,
            "bucket_mb": bucket_mb if overlap else "", "buckets": len(trainer.buckets) if overlap else 1,
            "first_layer_slices": first_layer_slices if overlap else "",
            "step_s": step_s, "samples_per_s": global_batch / step_s, "compute_s": ph.get("compute", 0.0),
            "comm_s": comm_s, "update_s": ph.get("update", 0.0), "comm_share": comm_s / total if total else 0.0,
            "allreduce_s": busy, "hidden_share": max(0.0, 1.0 - comm_s / busy) if overlap and busy else 0.0}


def scaling(comm, sizes, counts, global_batch: int | None = None,
            per_gpu_batch: int | None = None, **kwargs) -> list[dict]:
    """``measure`` on the first k ranks for each k in ``counts``; rows on every rank. Give ``global_batch``
    (strong scaling: the same batch split k ways) or ``per_gpu_batch`` (weak: the batch grows with k)."""
    if (global_batch is None) == (per_gpu_batch is None):
        raise ValueError("give global_batch (strong scaling) or per_gpu_batch (weak scaling)")
    rows = []
    for k in counts:
        if not 1 <= k <= comm.size:
            raise ValueError(f"cannot use {k} ranks of {comm.size}")
        batch = global_batch if global_batch is not None else per_gpu_batch * k
        with first_ranks(comm, k) as sub:
            row = measure(sub, sizes, batch, **kwargs) if sub is not None else None
        rows.append(comm.bcast(row, root=0))
    sweep = "strong" if global_batch is not None else "weak"
    for row, (s, e) in zip(rows, speedups([r["gpus"] for r in rows], [r["step_s"] for r in rows], sweep)):
        row.update(sweep=sweep, speedup=s, efficiency=e)
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
