"""Batch size and learning rate: train the digits model for each pair and tabulate.

The multi-node training guide's advice is to tune both together: a larger global batch takes fewer,
less noisy steps per epoch and usually wants a larger learning rate (the linear scaling rule).
"""
from __future__ import annotations

from hpclab.ddp.digits import DigitsConfig, train_digits


def sweep(comm, placement, batches, lrs, **overrides) -> list[dict]:
    """Train on every rank for each global batch x learning rate; one row per run in that order, the same
    on every rank. ``overrides`` go to ``DigitsConfig.for_backend`` (epochs, hidden, subset, ...)."""
    rows = []
    for batch in batches:
        for lr in lrs:
            cfg = DigitsConfig.for_backend(global_batch=int(batch), lr=float(lr), **overrides)
            out = train_digits(comm, placement, cfg, say=lambda _line: None)
            last = out["history"][-1]
            rows.append({
                "global_batch": cfg.global_batch, "lr": cfg.lr, "epochs": cfg.epochs, "steps": out["steps"],
                "train_loss": last["train_loss"], "val_acc": last["val_acc"], "test_acc": out["test_accuracy"],
                "train_s": out["train_seconds"], "samples_per_s": out["samples_per_s"],
                "time_to_threshold_s": out["time_to_threshold_s"], "threshold": cfg.threshold,
                "optimizer": cfg.optimizer, "ranks": comm.size, "replicas_identical": out["replicas_identical"],
                "reduced": cfg.reduced,
            })
    return rows


def best(rows: list[dict]) -> dict:
    """The run with the highest validation accuracy (ties: the lower final training loss)."""
    return max(rows, key=lambda r: (r["val_acc"], -r["train_loss"]))


def format_table(rows: list[dict]) -> str:
    """One line per run: batch, learning rate, steps, final losses and accuracies, speed."""
    lines = [f"{'batch':>6} {'lr':>8} {'steps':>6} {'train loss':>10} {'val acc':>8} "
             f"{'test acc':>8} {'train s':>8} {'samples/s':>10} {'to threshold':>12}"]
    for r in rows:
        reach = "-" if r["time_to_threshold_s"] is None else f"{r['time_to_threshold_s']:.2f} s"
        lines.append(f"{r['global_batch']:>6} {r['lr']:>8.2g} {r['steps']:>6} {r['train_loss']:>10.4f} "
                     f"{100 * r['val_acc']:>7.2f}% {100 * r['test_acc']:>7.2f}% {r['train_s']:>8.2f} "
                     f"{r['samples_per_s']:>10.0f} {reach:>12}")
    return "\n".join(lines)
