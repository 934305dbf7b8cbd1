"""Exercise 5 without PyTorch: the 6 -> 4 -> 2 MLP trained data-parallel on every rank's GPU."""
from __future__ import annotations

from hpclab import budget
from hpclab.comm import BACKENDS
from hpclab.ddp.sampler import check_batch
from hpclab.ddp.synthetic_training import SyntheticConfig, global_batch_for, train_synthetic
from hpclab.options import count, real, seed
from hpclab.runner import Program, Report

PROGRAM = Program("ddp-mlp", "ddp")
HELP = ("Workshop Exercise 5: data-parallel training of the 6->4->2 MLP on 1024 synthetic samples "
        "(weights broadcast from rank 0, shared shuffle, one gradient all-reduce per step).")


def add_arguments(parser) -> None:
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=count(1, 1 << 31), default=None,
                       help="samples per step over all ranks (default 32); split evenly among ranks")
    batch.add_argument("--per-rank-batch", type=count(1, 1 << 31), default=None,
                       help="instead: samples per step on each rank (the global batch grows with ranks)")
    parser.add_argument("--epochs", type=count(1, None), default=3)
    parser.add_argument("--lr", type=real(0, lo_open=True), default=0.05, help="learning rate (default 0.05)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--momentum", type=real(0, 1, hi_open=True), default=0.0,
                        help="SGD momentum, 0 <= momentum < 1 (default 0)")
    parser.add_argument("--scale-lr", action="store_true",
                        help="multiply the learning rate by the number of ranks (linear scaling rule)")
    parser.add_argument("--comm", default="auto", choices=BACKENDS, help="communication backend (default auto)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="float64 (default) makes 1 and n ranks agree to ~1e-15")
    parser.add_argument("--hidden", type=count(1, 1 << 20), default=4, help="hidden units (default 4)")
    parser.add_argument("--samples", type=count(1, 1 << 31), default=1024, help="data set size (default 1024)")
    parser.add_argument("--seed", type=seed(), default=0, help="data, weights and shuffling seed")
    parser.add_argument("--overlap", action="store_true",
                        help="all-reduce gradient buckets during the backward pass (same results)")
    parser.add_argument("--bucket-mb", type=real(0, 1 << 20, lo_open=True), default=25.0,
                        help="gradient bucket size in MiB with --overlap (default 25)")


def config(args) -> SyntheticConfig:
    return SyntheticConfig(**{k: v for k, v in vars(args).items() if k in SyntheticConfig.__dataclass_fields__})


def validate(args, launch) -> None:
    cfg = config(args)
    batch = global_batch_for(cfg, launch.ranks)
    flag = "--per-rank-batch" if args.per_rank_batch else "--global-batch"
    check_batch(cfg.samples, batch, launch.ranks, flag)
    steps = cfg.epochs * (cfg.samples // batch)
    params = 9 * cfg.hidden + 2
    flops = 6 * params * batch / launch.ranks             # forward and backward of a rank's share
    per_step = 12 * launch.fastest("launch_s") + flops / launch.fastest("flops")
    budget.refuse_long("--epochs", cfg.epochs, steps * per_step,
                       f"{steps:.3g} steps of {batch} samples, each at least 12 kernel launches and "
                       f"{flops:.3g} floating-point operations per rank",
                       "use fewer --epochs or --samples, a smaller --hidden or a larger batch")
    item = 8 if cfg.dtype == "float64" else 4
    budget.refuse_large("--samples", cfg.samples, launch.node_bytes(*(3 * 8 * 8 * cfg.samples,) * 2),
                        f"{cfg.samples} samples of 6 inputs and 2 outputs, on the host and the device",
                        available=launch.memory)
    per_rank = item * (8 * params + 4 * cfg.hidden * (batch // launch.ranks))
    budget.refuse_large("--hidden", cfg.hidden, launch.node_bytes(per_rank, per_rank),
                        f"{params} parameters with gradients and optimizer state, and activations",
                        available=launch.memory)


def run(args, ctx) -> Report:
    comm, size, rank = ctx.comm, ctx.comm.size, ctx.comm.rank
    cfg = config(args)
    out = train_synthetic(comm, cfg)
    losses, epoch_losses, times = out["losses"], out["epoch_losses"], out["times_s"]
    identical = out["replicas_identical"]
    report = Report(
        rank_line=(f"{ctx.placement.label()} | per-rank batch {out['per_rank_batch']} | steps/epoch "
                   f"{out['steps_per_epoch']} | first loss {losses[0]:.6e} | final loss "
                   f"{losses[-1]:.6e} | weight sum {out['weight_checksums']['sum']:.15e}"),
        passed=bool(identical and out["finite"] and out["learned"]),
        timings={f"{k}_s": v for k, v in times.items()},
    )
    if rank == 0:
        report.final = [
            ("Model", f"{' -> '.join(map(str, out['sizes']))} ReLU MLP, {out['parameters']} parameters, "
                      f"{out['dtype']}"),
            ("Data", f"{args.samples} synthetic samples (seed {args.seed}), squared-error loss"),
            ("Global batch", f"{out['global_batch']} = {size} rank(s) x {out['per_rank_batch']}"
                             + (" (per-rank batch held fixed)" if args.per_rank_batch else "")),
            ("Steps", f"{out['steps_per_epoch']} per epoch x {args.epochs} epochs" + (
                f" ({out['dropped_per_epoch']} samples skipped per epoch)" if out["dropped_per_epoch"] else "")),
            ("Optimizer", f"{args.optimizer}, lr {out['lr']:g}" + (" (scaled by ranks)" if args.scale_lr else "")),
            ("Gradient all-reduce", f"{out['comm']}, one per step, {out['bucket_values']} values"),
            ("Epoch losses", ", ".join(f"{v:.6f}" for v in epoch_losses)),
            ("Replicas identical", f"{identical} (checked after every epoch)"),
            ("Time (max rank)", ", ".join(f"{k} {v:.3f} s" for k, v in times.items())),
        ]
        if not out["learned"]:
            report.notes.append("the loss did not fall from the first to the last epoch")
        if not identical:
            report.notes.append("the replicas' weights differ: the gradients were not averaged identically")
        report.result = {k: out[k] for k in (
            "losses", "epoch_losses", "replicas_identical", "weight_checksums", "global_batch",
            "per_rank_batch", "steps_per_epoch", "epochs", "parameters", "lr", "comm", "dtype")}
    return report
