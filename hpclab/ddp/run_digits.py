"""Exercise 6 without PyTorch: data-parallel MLP classifier on scikit-learn's digits."""
from __future__ import annotations

from hpclab import budget
from hpclab.comm import BACKENDS
from hpclab.ddp.data import DIGITS, digits
from hpclab.ddp.digits import DigitsConfig, train_digits
from hpclab.ddp.model import count_parameters
from hpclab.ddp.sampler import check_batch
from hpclab.options import UsageError, count, count_list, real, seed
from hpclab.runner import Program, Report

PROGRAM = Program("ddp-digits", "ddp")
HELP = ("Workshop Exercise 6 on real data: an MLP classifier for scikit-learn's 8x8 digits trained "
        "data-parallel (per-epoch train/validation loss and accuracy, final test accuracy).")
KEEP_OUT = 10       # a subset leaves out at least one image of each digit (stratified split)


def add_arguments(parser) -> None:
    parser.add_argument("--hidden", type=count_list(1, 1 << 16, example="128,64"), default=None,
                        help="hidden layer widths, e.g. 128,64 (default 128,64; 16 on the simulator)")
    parser.add_argument("--epochs", type=count(1, None), default=None, help="default 20 (2 on the simulator)")
    parser.add_argument("--global-batch", type=count(1, DIGITS), default=None, help="default 64 (20 on the simulator)")
    parser.add_argument("--lr", type=real(0, lo_open=True), default=None, help="default 2e-3 (2e-2 on the simulator)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default=None, help="default adam")
    parser.add_argument("--precision", choices=("fp32", "mixed"), default=None,
                        help="mixed: float16 compute, float32 master weights, dynamic loss scaling")
    parser.add_argument("--subset", type=count(100, DIGITS), default=None,
                        help=f"use this many of the {DIGITS} images (default all; 400 on the simulator)")
    parser.add_argument("--threshold", type=real(0, 1, lo_open=True), default=None,
                        help="test accuracy needed to pass, above 0 and at most 1 (default 0.95; 0.75 on "
                             "the simulator)")
    parser.add_argument("--comm", default=None, choices=BACKENDS, help="communication backend (default auto)")
    parser.add_argument("--scale-lr", action="store_true", default=None,
                        help="multiply the learning rate by the number of ranks")
    parser.add_argument("--monitor", action="store_true", default=None,
                        help="sample GPU utilisation and memory (NVML) while training")
    parser.add_argument("--seed", type=seed((1 << 32) - 1), default=None,
                        help="data split, weights and shuffling (scikit-learn takes 0 to 2^32 - 1)")


def config(args) -> DigitsConfig:
    """The options given (each a field of the configuration), the backend's defaults for the others."""
    return DigitsConfig.for_backend(**{k: v for k, v in vars(args).items() if k in DigitsConfig.__dataclass_fields__})


def validate(args, launch) -> None:
    cfg = config(args)
    if cfg.subset is not None and DIGITS - KEEP_OUT < cfg.subset < DIGITS:
        raise UsageError(f"--subset {cfg.subset} leaves fewer than {KEEP_OUT} images out, one per digit, as the "
                         f"stratified split needs; use --subset {DIGITS - KEEP_OUT} or less, or all {DIGITS}")
    train = len(digits(cfg.seed, cfg.subset)["train"][1])
    check_batch(train, cfg.global_batch, launch.ranks)
    layers = len(cfg.hidden) + 1
    steps = cfg.epochs * (train // cfg.global_batch)
    params = count_parameters([64, *cfg.hidden, 10])
    flops = 6 * params * cfg.global_batch / launch.ranks   # forward and backward of a rank's share
    per_step = 6 * layers * launch.fastest("launch_s") + flops / launch.fastest("flops")
    budget.refuse_long("--epochs", cfg.epochs, steps * per_step,
                       f"{steps:.3g} steps, each at least {6 * layers} kernel launches and {flops:.3g} "
                       "floating-point operations per rank",
                       "use fewer --epochs, smaller --hidden layers or a larger --global-batch")
    activations = 4 * sum(cfg.hidden) * max(train, 1)          # a whole split through the model
    budget.refuse_large("--hidden", ",".join(map(str, cfg.hidden)),
                        launch.node_bytes(*(2 * (16 * params + activations),) * 2),
                        f"{params:.3g} parameters with gradients and optimizer state, and activations",
                        available=launch.memory)


def _mib(b) -> str:
    return f"{b / 2 ** 20:.2f} MiB"


def run(args, ctx) -> Report:
    cfg = config(args)
    comm, rank = ctx.comm, ctx.comm.rank
    if rank == 0 and cfg.reduced:
        print(f"simulator: reduced configuration (hidden {list(cfg.hidden)}, {cfg.subset} images, "
              f"{cfg.epochs} epochs, pass at {cfg.threshold:.0%}); a GPU runs 128,64 on all 1797 "
              "images for 20 epochs and must reach 95 %", flush=True)
    out = train_digits(comm, ctx.placement, cfg)
    report = Report(
        rank_line=(f"{ctx.placement.label()} | per-rank batch {cfg.global_batch // comm.size} | steps "
                   f"{out['steps']} | test accuracy {100 * out['test_accuracy']:.2f}%"),
        passed=out["passed"],
        timings={"train_s": out["train_seconds"],
                 **{f"{k}_s": v for k, v in out["phases_s"].items()}},
    )
    if rank == 0:
        mem, usage = out["memory"], out["gpu_usage"]
        alloc = sum(mem["allocated_by_model_bytes"].values())
        n = out["samples"]
        report.final = [
            ("Model", f"{' -> '.join(map(str, out['sizes']))} ReLU MLP, {out['parameters']} parameters"),
            ("Configuration", "reduced (simulator)" if cfg.reduced else "full"),
            ("Data", f"digits: {n['train']} train / {n['val']} validation / {n['test']} test, stratified"),
            ("Precision", cfg.precision + (f" (final loss scale {out['loss_scale']:g}, {out['skipped_steps']} "
                                           "steps skipped)" if cfg.precision == "mixed" else "")),
            ("Training", f"{cfg.epochs} epochs, global batch {cfg.global_batch}, {cfg.optimizer} "
                         f"lr {cfg.lr:g}, {out['train_seconds']:.2f} s, {out['samples_per_s']:.0f} samples/s"),
            ("Time to threshold", "not reached" if out["time_to_threshold_s"] is None
             else f"{out['time_to_threshold_s']:.2f} s (validation accuracy >= {cfg.threshold:.0%})"),
            ("Test accuracy", f"{100 * out['test_accuracy']:.2f}% (threshold {100 * cfg.threshold:.0f}%)"),
            ("Replicas identical", str(out["replicas_identical"])),
            ("Memory estimate 14 x P", _mib(mem["estimate_14p_bytes"])),
            ("Memory allocated", f"{_mib(alloc)} (weights, gradients, optimizer state, activations)"),
            ("Memory measured", _mib(mem["device_used_delta_bytes"]) + " more in use on the device"
             if mem["device_used_delta_bytes"] is not None else "n/a on the simulator"),
        ]
        if usage is not None:
            report.final.append(("GPU utilisation", (
                f"mean {usage['util_mean_pct']:.0f}%, max {usage['util_max_pct']:.0f}% "
                f"({usage['samples']} samples, {usage['source']})") if usage["samples"]
                else usage["note"]))
        if not out["passed"]:
            report.notes.append(f"test accuracy {100 * out['test_accuracy']:.2f}% is below "
                                f"{100 * cfg.threshold:.0f}%")
        report.result = {k: v for k, v in out.items() if k != "phases_s"}
    return report
