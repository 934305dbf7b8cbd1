"""Data-parallel training on real GPUs: accuracy, time to accuracy, throughput scaling.

  python -m benchmarks ddp --mode digits [--json-out F]        one GPU: digits in fp32 and mixed
  mpirun -n N python -m benchmarks ddp --mode scaling [--overlap] [--csv F]
                                                       samples/s of a wide MLP on N GPUs (with --overlap:
                                                       also with the all-reduce overlapped, same run)
  mpirun -n N python -m benchmarks ddp --mode buckets [--bucket-sizes 1,4,16,64,256]
                                                       overlapped steps for each bucket size (MiB)
  python -m benchmarks ddp --summarize F.csv                   speedup and efficiency vs 1 GPU
  [mpirun -n N] python -m benchmarks ddp --mode sweep [--batches 32,128,512 --lrs 1e-3,4e-3 --csv F]
                                                       digits: global batch x learning rate

The scaling model is an MLP of ``--layers`` dense layers ``--width`` wide (default 3 x 4096: 50.3 M parameters,
a 201 MB float32 gradient bucket) on random data (throughput does not depend on the values). Strong scaling
fixes the global batch, weak the per-GPU batch. Each point is the step time (max over ranks) and its split
(:func:`hpclab.ddp.throughput.measure`); with ``--overlap`` each point is measured again with ``--bucket-mb``
buckets all-reduced during the backward pass, the first layer's gradient in ``--first-layer-slices`` slices of
rows (:mod:`hpclab.ddp.buckets`), each bucket's update run as soon as its all-reduce is done, and with NCCL
the all-reduces of all buckets but the last run by kernels of at most ``--overlap-ctas`` thread blocks.
"""
from __future__ import annotations

import csv
import json
import os
import sys
import time

from hpclab import backend
from hpclab.comm import BACKENDS
from hpclab.ddp.digits import DigitsConfig, train_digits
from hpclab.ddp.sweep import best, format_table, sweep
from hpclab.ddp.throughput import classifier, measure
from hpclab.device import select_gpu
from hpclab.mpi import MPI, world
from hpclab.options import Parser, count, count_list, real, real_list
from hpclab.results.recorded import figure
from hpclab.speedup import speedups

from benchmarks.nccl_ctas import HiddenAllreduce

FIELDS = ["sweep", "gpus", "width", "layers", "parameters", "global_batch", "per_gpu_batch", "precision", "comm",
          "overlap", "bucket_mb", "buckets", "first_layer_slices", "overlap_ctas", "step_s", "samples_per_s",
          "compute_s", "comm_s", "update_s", "comm_share", "allreduce_s", "hidden_share", "host_queue_s",
          "host_share", "device"]
# Efficiency targets at 4 GPUs: (sweep, overlapped) -> minimum.
TARGETS = {("weak", False): 0.85, ("strong", True): 0.80, ("weak", True): 0.95}


def _setup():
    comm = world()
    return comm, select_gpu(comm)


def append_csv(path: str, rows: list[dict], fields: list[str]) -> None:
    """Add rows to a CSV file, with a header when the file is new."""
    new = not os.path.exists(path)
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def _measure(args, comm, placement, points) -> list[dict]:
    """One row per point (sweep, global batch, bucket MiB or None: no overlap), the same on every rank."""
    rows = []
    for sweep, batch, mb in points:
        hidden = HiddenAllreduce(args.overlap_ctas) if args.overlap_ctas else None
        overlap = mb is not None
        trainer = classifier(comm, [args.width] * (args.layers + 1), args.comm, args.precision == "mixed",
                             overlap=overlap, bucket_mb=mb or 25.0, first_layer_slices=args.first_layer_slices,
                             hidden_allreduce=hidden)
        row = measure(trainer, batch, steps=args.steps, warmup=args.warmup)
        # With overlap the all-reduces run during compute, so their own time is not a phase.
        busy = comm.allreduce(trainer.allreduce_busy_s, op=MPI().MAX) / args.steps if overlap else row["comm_s"]
        # The host's time queueing a step (the slowest rank's), against the step: near 1, the GPU waits for it
        queue = comm.allreduce(trainer.host_queue_s, op=MPI().MAX) / args.steps if overlap else ""
        row.update(precision=args.precision, overlap=overlap, bucket_mb=mb if overlap else "",
                   buckets=len(trainer.buckets) if overlap else 1,
                   first_layer_slices=args.first_layer_slices if overlap else "", allreduce_s=busy,
                   hidden_share=max(0.0, 1.0 - row["comm_s"] / busy) if overlap and busy else 0.0,
                   overlap_ctas=hidden.max_ctas if hidden and hidden.used else "", host_queue_s=queue,
                   host_share=queue / row["step_s"] if overlap else "")
        rows.append({"sweep": sweep, "width": args.width, "layers": args.layers, **row, "device": placement.gpu_name})
    return rows


def _report(args, rows: list[dict], rank: int) -> int:
    if rank == 0:
        for row in rows:
            print(json.dumps({"bench": "ddp-scaling", **row}))
        if args.csv:
            append_csv(args.csv, rows, FIELDS)
    return 0


def scaling(args) -> int:
    comm, placement = _setup()
    points = []
    for kind, batch in (("strong", args.global_batch), ("weak", args.per_gpu_batch * comm.size)):
        if batch % comm.size:
            if comm.rank == 0:
                print(f"skip {kind}: global batch {batch} does not divide among {comm.size} GPUs")
            continue
        points += [(kind, batch, None)] + ([(kind, batch, args.bucket_mb)] if args.overlap else [])
    return _report(args, _measure(args, comm, placement, points), comm.rank)


def buckets(args) -> int:
    """Overlapped steps at one batch for several bucket sizes, and the non-overlapped step beside them."""
    comm, placement = _setup()
    sizes = [None, *(args.bucket_sizes or [1, 4, 16, 64, 256])]
    rows = _measure(args, comm, placement, [("buckets", args.per_gpu_batch * comm.size, mb) for mb in sizes])
    if comm.rank == 0:
        print(f"{comm.size} GPU(s), batch {args.per_gpu_batch} per GPU, {rows[0]['parameters'] / 1e6:.1f} M "
              f"parameters, comm {rows[0]['comm']}:")
        print(f"  {'buckets':>14} {'step ms':>8} {'compute':>8} {'exposed':>8} {'all-reduce':>10} {'hidden':>7}")
        for r in rows:
            what = f"{r['buckets']} x {r['bucket_mb']:g} MiB" if r["overlap"] else "none (after)"
            print(f"  {what:>14} {1e3 * r['step_s']:8.2f} {1e3 * r['compute_s']:8.2f} {1e3 * r['comm_s']:8.2f} "
                  f"{1e3 * r['allreduce_s']:10.2f} {100 * r['hidden_share']:6.1f}%")
    return _report(args, rows, comm.rank)


def figures(table: list[dict]) -> list[dict]:
    """Step time of the MLP per GPU count; efficiency against 1 GPU (:func:`hpclab.speedup.speedups`); with the
    all-reduce overlapped (variant ...-overlap, or buckets-<MiB>), how much of it was hidden."""
    def variant(r):
        if r.get("overlap") != "True":
            return r["sweep"]
        return f"buckets-{float(r['bucket_mb']):g}" if r["sweep"] == "buckets" else f"{r['sweep']}-overlap"

    base = {variant(r): float(r["step_s"]) for r in table if r["gpus"] == "1"}
    rows = []
    for r in table:
        n, step, v = int(r["gpus"]), float(r["step_s"]), variant(r)
        mode = "weak" if r["sweep"] == "weak" else "strong"
        eff = speedups([1, n], [base[v], step], mode)[-1][1] if v in base else None
        metrics = [("step_s", step, "s"), ("samples_per_s", r["samples_per_s"], "samples/s"),
                   ("comm_share", r["comm_share"], "1"), ("efficiency", eff, "1"), ("parameters", r["parameters"], "1")]
        if r.get("overlap") in ("True", "False"):        # the CSV has the split (since overlap was added)
            metrics += [("compute_s", r["compute_s"], "s"), ("update_s", r["update_s"], "s")]
        if r.get("overlap") == "True":
            metrics += [("comm_s", r["comm_s"], "s"), ("allreduce_s", r["allreduce_s"], "s"),
                        ("hidden_share", r["hidden_share"], "1"), ("buckets", r["buckets"], "1")]
            if r.get("host_queue_s"):                     # (since the host's queueing was measured)
                metrics += [("host_queue_s", r["host_queue_s"], "s"), ("host_share", r["host_share"], "1")]
        rows += [figure("ddp-scaling", v, n, int(r["global_batch"]), "samples", metric, value, unit)
                 for metric, value, unit in metrics if value is not None]
    return rows


def summarize(path: str) -> int:
    """Speedup and efficiency per sweep from a scaling CSV, the targets at 4 GPUs, and one JSON line of figures."""
    with open(path) as fh:
        table = list(csv.DictReader(fh))
    verdicts = []
    for kind, overlap in ((s, o) for s in ("strong", "weak") for o in (False, True)):
        pts = sorted((r for r in table if r["sweep"] == kind and (r.get("overlap") == "True") == overlap),
                     key=lambda r: int(r["gpus"]))
        base = next((r for r in pts if r["gpus"] == "1"), None)
        if base is None:
            continue
        slices = pts[-1].get("first_layer_slices") or "1"
        how = (f"overlapped, {pts[-1]['buckets']} buckets of {pts[-1]['bucket_mb']} MiB"
               + (f" (the first layer in {slices} slices)" if slices != "1" else "")
               + (f", all but the last by at most {pts[-1]['overlap_ctas']} CTAs"
                  if pts[-1].get("overlap_ctas") else "")) if overlap else \
            "all-reduce after the backward pass"
        print(f"{kind} scaling ({'global batch fixed' if kind == 'strong' else 'per-GPU batch fixed'}), "
              f"{int(base['parameters']) / 1e6:.1f} M parameters, comm {pts[-1]['comm']}, {how}:")
        print(f"  {'GPUs':>4} {'batch':>6} {'step ms':>8} {'samples/s':>10} {'speedup':>8} "
              f"{'efficiency':>10} {'comm share':>10} {'hidden':>7}" + ("  host queueing" if overlap else ""))
        for r in pts:
            n = int(r["gpus"])
            speedup, eff = speedups([1, n], [float(base["step_s"]), float(r["step_s"])], kind)[-1]
            if n == 4 and (kind, overlap) in TARGETS:
                verdicts.append(f"{kind}{' overlapped' if overlap else ''} >= {TARGETS[kind, overlap]}: "
                                f"{'met' if eff >= TARGETS[kind, overlap] else 'NOT met'} ({eff:.2f})")
            hidden = f"{100 * float(r['hidden_share']):6.1f}%" if overlap and r.get("hidden_share") else "      -"
            host = (f"  {1e3 * float(r['host_queue_s']):.2f} ms, {100 * float(r['host_share']):.0f} % of the step"
                    if overlap and r.get("host_queue_s") else "")
            print(f"  {n:>4} {r['global_batch']:>6} {1e3 * float(r['step_s']):>8.2f} "
                  f"{float(r['samples_per_s']):>10.0f} {speedup:>8.2f} {eff:>10.2f} "
                  f"{100 * float(r['comm_share']):>9.1f}% {hidden}{host}")
    print("targets at 4 GPUs:", "; ".join(verdicts) if verdicts else "no 4-GPU point measured")
    print(json.dumps({"topic": "ddp", "device_name": table[0].get("device", ""), "figures": figures(table)}))
    return 0


def digits_bench(args) -> int:
    comm, placement = _setup()
    results = {}
    for precision in ("fp32", "mixed"):
        # Warm-up run: Numba compiles each kernel on first use; keep that out of the timings.
        train_digits(comm, placement, DigitsConfig.for_backend(precision=precision, epochs=1), say=lambda _line: None)
        cfg = DigitsConfig.for_backend(precision=precision, monitor=True)
        out = results[precision] = train_digits(comm, placement, cfg)
        if comm.rank == 0:
            mem = out["memory"]
            print(json.dumps({"bench": "ddp-digits", "precision": precision, "test_accuracy": out["test_accuracy"],
                              "passed": out["passed"], "time_to_threshold_s": out["time_to_threshold_s"],
                              "train_s": out["train_seconds"], "samples_per_s": out["samples_per_s"],
                              "estimate_14p_bytes": mem["estimate_14p_bytes"],
                              "allocated_bytes": sum(mem["allocated_by_model_bytes"].values()),
                              "device_used_delta_bytes": mem["device_used_delta_bytes"],
                              "gpu_usage": out["gpu_usage"], "device": placement.gpu_name}))
    if comm.rank == 0 and args.json_out:
        found = [figure("ddp-digits", precision, 1, "", "", metric, r[key], unit) for precision, r in results.items()
                 for metric, key, unit in (("test_accuracy", "test_accuracy", "1"), ("train_s", "train_seconds", "s"),
                                           ("time_to_threshold_s", "time_to_threshold_s", "s"),
                                           ("loss_scale", "loss_scale", "1")) if r.get(key)]
        with open(args.json_out, "w") as fh:
            json.dump({"device": placement.gpu_name, "date": time.strftime("%Y-%m-%d"), "results": results,
                       "topic": "ddp", "device_name": placement.gpu_name, "figures": found}, fh, default=float)
    return 0 if all(r["passed"] for r in results.values()) else 1


def sweep_bench(args) -> int:
    comm, placement = _setup()
    sim = backend.is_simulator()
    batches = args.batches or ([20, 40] if sim else [32, 128, 512])
    lrs = args.lrs or ([2e-2, 5e-2] if sim else [1e-3, 4e-3, 1.6e-2])
    bad = [b for b in batches if b % comm.size]
    if bad:
        if comm.rank == 0:
            print(f"python -m benchmarks ddp: global batches {bad} do not divide among {comm.size} ranks; "
                  f"use multiples of {comm.size}", file=sys.stderr)
        return 2
    # Numba compiles each kernel on its first call: one short run keeps that out of the table.
    sweep(comm, placement, batches[:1], lrs[:1], epochs=1)
    rows = sweep(comm, placement, batches, lrs, epochs=args.epochs or (1 if sim else None))
    if comm.rank == 0:
        top = best(rows)
        print(f"digits, {comm.size} rank(s), {rows[0]['optimizer']}, {rows[0]['epochs']} epochs"
              + (" (reduced configuration: simulator)" if rows[0]["reduced"] else "") + ":")
        print(format_table(rows))
        print(f"best: global batch {top['global_batch']}, lr {top['lr']:g} "
              f"(validation accuracy {100 * top['val_acc']:.2f}%)")
        rows = [{**r, "device": placement.gpu_name} for r in rows]
        for row in rows:
            print(json.dumps({"bench": "ddp-sweep", **row}))
        if args.csv:
            append_csv(args.csv, rows, list(rows[0]))
    return 0 if all(r["replicas_identical"] for r in rows) else 1


def main(argv) -> int:
    p = Parser(prog="python -m benchmarks ddp", description=__doc__)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--mode", choices=("digits", "scaling", "sweep", "buckets"))
    what.add_argument("--summarize", metavar="CSV", help="print speedup and efficiency from a scaling CSV")
    p.add_argument("--width", type=count(1, 1 << 20), default=4096)
    p.add_argument("--layers", type=count(1, 1000), default=3)
    p.add_argument("--global-batch", type=count(1, 1 << 24), default=2048, help="strong scaling: fixed global batch")
    p.add_argument("--per-gpu-batch", type=count(1, 1 << 24), default=1024, help="weak scaling: fixed per-GPU batch")
    p.add_argument("--steps", type=count(1, 10**6), default=5, help="timed steps per point (after warm-up)")
    p.add_argument("--warmup", type=count(0, 10**6), default=2)
    p.add_argument("--precision", choices=("fp32", "mixed"), default="fp32")
    p.add_argument("--comm", default="auto", choices=BACKENDS)
    p.add_argument("--overlap", action="store_true",
                   help="scaling: also measure with the gradient all-reduce overlapped with the backward pass")
    p.add_argument("--bucket-mb", type=real(0, 1 << 20, lo_open=True), default=25.0,
                   help="size of a gradient bucket in MiB when overlapping (PyTorch's default: 25)")
    p.add_argument("--first-layer-slices", type=count(1, 1 << 20), default=4,
                   help="when overlapping: the first layer's gradient, written last, in this many slices of rows, "
                        "each all-reduced as soon as it is written (1: one bucket for the layer, as in PyTorch)")
    p.add_argument("--overlap-ctas", type=count(0, 64), default=8,
                   help="when overlapping with NCCL: run the all-reduce of every bucket but the last with kernels "
                        "of at most this many thread blocks, which leaves the backward pass more SMs (0: as many as "
                        "NCCL picks)")
    p.add_argument("--bucket-sizes", type=real_list(0, lo_open=True, example="1,4,16,64"), default=None,
                   help="buckets: the bucket sizes (MiB) to compare (default 1,4,16,64,256)")
    p.add_argument("--csv", help="append scaling rows to this CSV (rank 0)")
    p.add_argument("--json-out", help="write the digits results to this JSON file")
    p.add_argument("--batches", type=count_list(1, 1 << 24, example="32,128"), default=None,
                   help="sweep: global batches (default 32,128,512; 20,40 on the simulator)")
    p.add_argument("--lrs", type=real_list(0, lo_open=True, example="1e-3,4e-3"), default=None,
                   help="sweep: learning rates (default 1e-3,4e-3,1.6e-2; 2e-2,5e-2 on the simulator)")
    p.add_argument("--epochs", type=count(1, None), default=None,
                   help="sweep: epochs per run (default that of ddp-digits: 20; 1 on the simulator)")
    args = p.parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    return {"digits": digits_bench, "scaling": scaling, "sweep": sweep_bench, "buckets": buckets}[args.mode](args)
