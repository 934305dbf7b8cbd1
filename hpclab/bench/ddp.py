"""Data-parallel training on real GPUs: accuracy, time to accuracy, throughput scaling.

  hpclab bench ddp --mode digits [--json-out F]        one GPU: digits in fp32 and mixed
  mpirun -n N hpclab bench ddp --mode scaling [--csv F] samples/s of a wide MLP on N GPUs
  hpclab bench ddp --summarize F.csv                   speedup and efficiency vs 1 GPU

The scaling model is an MLP of ``--layers`` dense layers ``--width`` wide
(default 3 x 4096: 50.3 M parameters, a 201 MB float32 gradient bucket),
trained on random data (throughput does not depend on the values). Two
sweeps: strong (global batch fixed, each GPU gets global/N) and weak
(per-GPU batch fixed). Each reports the step time (max over ranks) and
its split into compute, gradient all-reduce and update.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

import numpy as np

FIELDS = ["sweep", "gpus", "width", "layers", "parameters", "global_batch", "per_gpu_batch",
          "precision", "comm", "step_s", "samples_per_s", "compute_s", "comm_s", "update_s",
          "comm_share", "device"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpclab bench ddp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("digits", "scaling"), default=None)
    p.add_argument("--summarize", metavar="CSV", help="print speedup and efficiency from a scaling CSV")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=2048, help="strong scaling: fixed global batch")
    p.add_argument("--per-gpu-batch", type=int, default=1024, help="weak scaling: fixed per-GPU batch")
    p.add_argument("--steps", type=int, default=5, help="timed steps per point (after warm-up)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--precision", choices=("fp32", "mixed"), default="fp32")
    p.add_argument("--comm", default="auto")
    p.add_argument("--csv", help="append scaling rows to this CSV (rank 0)")
    p.add_argument("--json-out", help="write the digits results to this JSON file")
    return p


def _setup():
    from .. import backend

    backend.select()
    from ..device import select_gpu
    from ..mpi import world

    comm = world()
    placement = select_gpu(comm)
    return comm, placement


def _time_steps(trainer, x_dev, y_dev, idx_dev, global_batch, steps, warmup, comm):
    from mpi4py import MPI

    from ..timing import Phases

    for _ in range(warmup):
        trainer.step(x_dev, y_dev, idx_dev, global_batch)
    trainer.phases = Phases(sync=True)
    comm.Barrier()
    t0 = MPI.Wtime()
    for _ in range(steps):
        trainer.step(x_dev, y_dev, idx_dev, global_batch)
    local = (MPI.Wtime() - t0) / steps
    phases = {k: v / steps for k, v in trainer.phases.max_over_ranks(comm).items()}
    return comm.allreduce(local, op=MPI.MAX), phases


def scaling(args) -> int:
    from ..ddp import MLP, DDPTrainer, init_parameters
    from ..kernels import mlp as K

    comm, placement = _setup()
    size, rank = comm.size, comm.rank
    sizes = [args.width] * (args.layers + 1)
    mixed = args.precision == "mixed"
    model = MLP(sizes, np.float32, np.float16 if mixed else np.float32)
    model.load(init_parameters(sizes, seed=0))
    trainer = DDPTrainer(model, comm, args.comm, optimizer="sgd", lr=1e-3, loss="xent",
                         loss_scaling=mixed)
    points = [("strong", args.global_batch), ("weak", args.per_gpu_batch * size)]
    most = max(g // size for _, g in points)
    rng = np.random.default_rng(rank)
    x_dev = K.cuda.to_device(rng.standard_normal((most, args.width)).astype(np.float32))
    y_dev = K.cuda.to_device(rng.integers(0, args.width, (most, 1)).astype(np.int32))
    rows = []
    for sweep, global_batch in points:
        if global_batch % size:
            if rank == 0:
                print(f"skip {sweep}: global batch {global_batch} does not divide among {size} GPUs")
            continue
        per = global_batch // size
        idx_dev = K.cuda.to_device(np.arange(per, dtype=np.int32))
        step_s, ph = _time_steps(trainer, x_dev, y_dev, idx_dev, global_batch, args.steps,
                                 args.warmup, comm)
        total = sum(ph.values())
        rows.append({"sweep": sweep, "gpus": size, "width": args.width, "layers": args.layers,
                     "parameters": model.n_params, "global_batch": global_batch,
                     "per_gpu_batch": per, "precision": args.precision, "comm": trainer.be.name,
                     "step_s": step_s, "samples_per_s": global_batch / step_s,
                     "compute_s": ph.get("compute", 0.0), "comm_s": ph.get("comm", 0.0),
                     "update_s": ph.get("update", 0.0),
                     "comm_share": ph.get("comm", 0.0) / total if total else 0.0,
                     "device": placement.gpu_name})
    if rank == 0:
        for row in rows:
            print(json.dumps({"bench": "ddp-scaling", **row}))
        if args.csv:
            new = not os.path.exists(args.csv)
            with open(args.csv, "a", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=FIELDS)
                if new:
                    writer.writeheader()
                writer.writerows(rows)
    return 0


def summarize(path: str) -> int:
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    ok, seen4 = True, False
    for sweep in ("strong", "weak"):
        pts = sorted((r for r in rows if r["sweep"] == sweep), key=lambda r: int(r["gpus"]))
        base = next((r for r in pts if r["gpus"] == "1"), None)
        if not pts or base is None:
            continue
        print(f"{sweep} scaling ({'global batch fixed' if sweep == 'strong' else 'per-GPU batch fixed'}), "
              f"{int(base['parameters']) / 1e6:.1f} M parameters, comm {pts[-1]['comm']}:")
        print(f"  {'GPUs':>4} {'batch':>6} {'step ms':>8} {'samples/s':>10} {'speedup':>8} "
              f"{'efficiency':>10} {'comm share':>10}")
        for r in pts:
            n = int(r["gpus"])
            speedup = float(r["samples_per_s"]) / float(base["samples_per_s"])
            eff = speedup / n
            if n == 4:
                seen4 = True
                ok = ok and eff >= 0.85
            print(f"  {n:>4} {r['global_batch']:>6} {1e3 * float(r['step_s']):>8.2f} "
                  f"{float(r['samples_per_s']):>10.0f} {speedup:>8.2f} {eff:>10.2f} "
                  f"{100 * float(r['comm_share']):>9.1f}%")
    print("target: efficiency >= 0.85 at 4 GPUs:",
          ("met" if ok else "NOT met") if seen4 else "no 4-GPU point measured")
    return 0


def digits_bench(args) -> int:
    from ..ddp.digits import DigitsConfig, train_digits

    comm, placement = _setup()
    results = {}
    for precision in ("fp32", "mixed"):
        # Warm-up run: Numba compiles each kernel on first use; keep that out of the timings.
        train_digits(comm, placement, DigitsConfig.for_backend(precision=precision, epochs=1),
                     say=lambda _line: None)
        cfg = DigitsConfig.for_backend(precision=precision, monitor=True)
        out = train_digits(comm, placement, cfg)
        results[precision] = out
        if comm.rank == 0:
            mem = out["memory"]
            print(json.dumps({"bench": "ddp-digits", "precision": precision,
                              "test_accuracy": out["test_accuracy"], "passed": out["passed"],
                              "time_to_threshold_s": out["time_to_threshold_s"],
                              "train_s": out["train_seconds"], "samples_per_s": out["samples_per_s"],
                              "estimate_14p_bytes": mem["estimate_14p_bytes"],
                              "allocated_bytes": sum(mem["allocated_by_model_bytes"].values()),
                              "device_used_delta_bytes": mem["device_used_delta_bytes"],
                              "gpu_usage": out["gpu_usage"], "device": placement.gpu_name}))
    if comm.rank == 0 and args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"device": placement.gpu_name, "date": time.strftime("%Y-%m-%d"),
                       "results": results}, fh, indent=1, default=float)
    return 0 if all(r["passed"] for r in results.values()) else 1


def main(argv) -> int:
    args = _parser().parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    if args.mode == "digits":
        return digits_bench(args)
    if args.mode == "scaling":
        return scaling(args)
    print("hpclab bench ddp: give --mode digits, --mode scaling or --summarize CSV", file=sys.stderr)
    return 2
