"""Exercise 5 without PyTorch: the 6 -> 4 -> 2 MLP trained data-parallel on every rank's GPU."""
from __future__ import annotations

import math

import numpy as np

from .. import comm as hcomm
from ..ddp import MLP, DDPTrainer, DistributedSampler, count_parameters, init_parameters
from ..ddp.data import synthetic
from ..runner import Report, parse_count

HELP = ("Workshop Exercise 5: data-parallel training of the 6->4->2 MLP on 1024 synthetic samples "
        "(weights broadcast from rank 0, shared shuffle, one gradient all-reduce per step).")


def add_arguments(parser) -> None:
    parser.add_argument("--global-batch", type=parse_count, default=None,
                        help="samples per step over all ranks (default 32); split evenly among ranks")
    parser.add_argument("--per-rank-batch", type=parse_count, default=None,
                        help="instead: samples per step on each rank (the global batch grows with ranks)")
    parser.add_argument("--epochs", type=parse_count, default=3)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default 0)")
    parser.add_argument("--scale-lr", action="store_true",
                        help="multiply the learning rate by the number of ranks (linear scaling rule)")
    parser.add_argument("--comm", default="auto", help="communication backend (default auto)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="float64 (default) makes 1 and n ranks agree to ~1e-15")
    parser.add_argument("--hidden", type=parse_count, default=4, help="hidden units (default 4)")
    parser.add_argument("--samples", type=parse_count, default=1024, help="data set size (default 1024)")
    parser.add_argument("--seed", type=int, default=0, help="data, weights and shuffling seed")


def _global_batch(args, size: int, n: int) -> int:
    if args.global_batch and args.per_rank_batch:
        raise ValueError("give --global-batch or --per-rank-batch, not both")
    if args.per_rank_batch:
        batch = args.per_rank_batch * size
        if batch > n:
            raise ValueError(
                f"--per-rank-batch {args.per_rank_batch} x {size} ranks = {batch} samples per step, "
                f"more than the data set ({n} samples); use --per-rank-batch {max(1, n // size)} or less")
        return batch
    return args.global_batch or 32


def run(args, ctx) -> Report:
    comm, size, rank = ctx.comm, ctx.comm.size, ctx.comm.rank
    sizes = [6, args.hidden, 2]
    dtype = np.dtype(args.dtype)
    with hcomm.step(comm, "input check"):
        global_batch = _global_batch(args, size, args.samples)
        sampler = DistributedSampler(args.samples, global_batch, rank, size, seed=args.seed)
        if not args.lr > 0:
            raise ValueError(f"--lr must be positive (got {args.lr})")
        be = hcomm.get(args.comm, comm)
    x, y = synthetic(args.samples, seed=args.seed)
    with hcomm.step(comm, "model setup"):
        model = MLP(sizes, dtype)
        # Every rank starts from its own random weights: the broadcast from
        # rank 0 is what makes them equal (and the replica check proves it).
        model.load(init_parameters(sizes, seed=args.seed + 7919 * rank))
        x_dev, y_dev = be.to_device(x.astype(dtype)), be.to_device(y.astype(dtype))
    trainer = DDPTrainer(model, comm, be, optimizer=args.optimizer, lr=args.lr,
                         momentum=args.momentum, scale_lr=args.scale_lr, loss="mse")
    losses, epoch_losses, identical = [], [], True
    checks = []
    for epoch in range(args.epochs):
        step_losses, _ = trainer.train_epoch(x_dev, y_dev, sampler, epoch)
        losses += step_losses
        epoch_losses.append(float(np.mean(step_losses)))
        replicas = trainer.replicas()   # once per epoch, on every rank
        checks.append(replicas)
        identical &= replicas["identical"]
    times = trainer.phases.max_over_ranks(comm)

    finite = all(math.isfinite(v) for v in losses)
    learned = epoch_losses[-1] < epoch_losses[0] if len(epoch_losses) > 1 else losses[-1] < losses[0]
    p = ctx.placement
    report = Report(
        rank_line=(f"{p.label()} | per-rank batch {sampler.per_rank} | steps/epoch "
                   f"{sampler.steps_per_epoch} | first loss {losses[0]:.6e} | final loss "
                   f"{losses[-1]:.6e} | weight sum {checks[-1]['sum']:.15e}"),
        passed=bool(identical and finite and learned),
        timings={**{f"{k}_s": v for k, v in times.items()}},
    )
    if rank == 0:
        n_params = count_parameters(sizes)
        report.final = [
            ("Model", f"{' -> '.join(map(str, sizes))} ReLU MLP, {n_params} parameters, {dtype.name}"),
            ("Data", f"{args.samples} synthetic samples (seed {args.seed}), squared-error loss"),
            ("Global batch", f"{global_batch} = {size} rank(s) x {sampler.per_rank}"
                             + (" (per-rank batch held fixed)" if args.per_rank_batch else "")),
            ("Steps", f"{sampler.steps_per_epoch} per epoch x {args.epochs} epochs"
                      + (f" ({sampler.dropped} samples skipped per epoch)" if sampler.dropped else "")),
            ("Optimizer", f"{args.optimizer}, lr {trainer.lr:g}" + (" (scaled by ranks)" if args.scale_lr else "")),
            ("Gradient all-reduce", f"{trainer.be.name}, one per step, {model.bucket.size} values"),
            ("Epoch losses", ", ".join(f"{v:.6f}" for v in epoch_losses)),
            ("Replicas identical", f"{identical} (checked after every epoch)"),
            ("Time (max rank)", ", ".join(f"{k} {v:.3f} s" for k, v in times.items())),
        ]
        if not learned:
            report.notes.append("the loss did not fall from the first to the last epoch")
        if not identical:
            report.notes.append("the replicas' weights differ: the gradients were not averaged identically")
        report.result = {
            "losses": losses, "epoch_losses": epoch_losses, "replicas_identical": bool(identical),
            "weight_checksums": checks[-1], "global_batch": global_batch,
            "per_rank_batch": sampler.per_rank, "steps_per_epoch": sampler.steps_per_epoch,
            "epochs": args.epochs, "parameters": n_params, "lr": trainer.lr,
            "comm": trainer.be.name, "dtype": dtype.name,
        }
    return report
