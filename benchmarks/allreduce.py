"""All-reduce bandwidth and latency per backend: ``python -m benchmarks allreduce``.

    mpiexec -n 2 python -m benchmarks allreduce --sizes 4,1K,1M,256M --backend all --json

Per message size and backend: the median time of ``--repeats`` calls after warm-up (each call
starts after a barrier; its time is the slowest rank's), the algorithm bandwidth ``algbw = bytes /
time`` and the bus bandwidth ``busbw = algbw * 2(n-1)/n`` (nccl-tests' definition: what each link
carries in a ring all-reduce, comparable across rank counts). Every rank fills its buffer with
``rank + 1``; a row is verified when the result is ``n(n+1)/2`` everywhere. On GPUs with NCCL a
raw-NCCL baseline (CuPy arrays, ``cupy.cuda.nccl`` called directly) is timed in the same job: the
ratio of the two is the cost of hpclab's layer.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from hpclab import backend
from hpclab.comm.measure import RAW, human, parse_size, run, table
from hpclab.device import select_gpu
from hpclab.errors import RankError, step
from hpclab.mpi import world
from hpclab.options import Parser, UsageError, count
from hpclab.results.recorded import figure
from hpclab.runner import env_rank

BACKEND_CHOICES = ("auto", "mpi-host", "mpi-cuda", "nccl", "all")


def parse_sizes(text: str, itemsize: int) -> list[int]:
    """``--sizes``: comma-separated message sizes (:func:`hpclab.comm.measure.parse_size`), whole elements each."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(items):
        raise UsageError(f"{text!r} has an empty item; give sizes like 4,1K,1M,256M")
    sizes = [parse_size(t) for t in items]
    for s in sizes:
        if s <= 0 or s % itemsize:
            raise UsageError(f"size {s} B is not a positive multiple of the element size "
                             f"({itemsize} B); use e.g. {max(itemsize, s - s % itemsize)}")
    return sizes


def ratios(rows: list[dict]) -> list[dict]:
    """hpclab-nccl against raw NCCL, size by size."""
    raw = {r["size_bytes"]: r for r in rows if r["backend"] == RAW}
    return [{"size_bytes": r["size_bytes"], "busbw_ratio": r["busbw_GBps"] / raw[r["size_bytes"]]["busbw_GBps"],
             "time_ratio": r["time_us"] / raw[r["size_bytes"]]["time_us"]}
            for r in rows if r["backend"] == "nccl" and r["size_bytes"] in raw]


def targets(rat: list[dict]) -> dict:
    """The goals: >= 95 % of raw busbw at 256 MiB (or the largest size >= it), and small
    messages (<= 64 KiB) no slower than 1.5x raw."""
    big = [r for r in rat if r["size_bytes"] >= 256 << 20]
    small = [r for r in rat if r["size_bytes"] <= 64 << 10]
    result = {}
    if big:
        b = min(big, key=lambda r: r["size_bytes"])
        result["busbw_ratio_large"] = {"size_bytes": b["size_bytes"], "ratio": b["busbw_ratio"],
                                       "target": 0.95, "met": b["busbw_ratio"] >= 0.95}
    if small:
        worst = max(small, key=lambda r: r["time_ratio"])
        result["latency_ratio_small"] = {"size_bytes": worst["size_bytes"], "ratio": worst["time_ratio"],
                                         "target": 1.5, "met": worst["time_ratio"] <= 1.5}
    return result


def figures(rows: list[dict], n: int) -> list[dict]:
    """Time and bus bandwidth per backend and size, raw NCCL the baseline (the first sizes, below 64 B,
    include NCCL's set-up: not a latency)."""
    raw = {r["size_bytes"]: r for r in rows if r["backend"] == RAW}
    out = []
    for r in (r for r in rows if r["size_bytes"] >= 64):
        b = raw.get(r["size_bytes"]) if r["backend"] != RAW else None
        out += [figure("allreduce", r["backend"], n, r["size_bytes"], "bytes", "time_s", r["time_us"] * 1e-6, "s",
                       RAW, b and b["time_us"] * 1e-6),
                figure("allreduce", r["backend"], n, r["size_bytes"], "bytes", "busbw", r["busbw_GBps"], "GB/s",
                       RAW, b and b["busbw_GBps"])]
    return out


def main(argv: list[str]) -> int:
    rank = env_rank()
    p = Parser(prog="python -m benchmarks allreduce", description=__doc__)
    p.add_argument("--sizes", default=None,
                   help="message sizes in bytes, comma-separated, K/M/G = 1024^k "
                        "(default 4,1K,64K,1M,16M,256M on a GPU; 1K,64K on the simulator)")
    p.add_argument("--backend", default="auto", choices=BACKEND_CHOICES,
                   help="which backend(s) to measure; all = every one that runs here")
    p.add_argument("--repeats", type=count(1, 10**6), default=None,
                   help="timed calls per size (default: as many as fit ~0.3 s, 3..50 on a GPU; 3 on the simulator)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--no-raw", action="store_true", help="skip the raw-NCCL baseline")
    p.add_argument("--json", action="store_true", help="end rank 0's output with one JSON line")
    args = p.parse_args(argv)       # a UsageError here: the hpclab command says it, exit 2
    try:
        sizes = parse_sizes(args.sizes, np.dtype(args.dtype).itemsize) if args.sizes is not None else None
    except UsageError as exc:
        p.error(f"argument --sizes: {exc}")
    try:
        backend.select()
    except backend.BackendError as exc:
        print(f"[rank {rank}] error: {exc}", file=sys.stderr, flush=True)
        return 2
    comm = world()
    rank = comm.rank
    sizes = sizes or (["1K", "64K"] if backend.is_simulator() else ["4", "1K", "64K", "1M", "16M", "256M"])
    try:
        with step(comm, "GPU selection"):
            placement = select_gpu(comm)
        backend.banner(rank)
        rows, notes = run(comm, args.backend, sizes, args.dtype, args.repeats, raw=not args.no_raw)
    except RankError as exc:
        print(f"[rank {rank}] error: {exc}", file=sys.stderr, flush=True)
        return 1
    rat = ratios(rows)
    passed = bool(rows) and all(r["verified"] for r in rows)
    if rank == 0:
        print(f"benchmarks allreduce | {comm.size} ranks | {backend.describe()} | "
              f"{placement.gpu_name} | {args.dtype}")
        print(table(rows, comm.size))
        for r in rat:
            print(f"nccl/raw-nccl {human(r['size_bytes']):>6}: busbw {100 * r['busbw_ratio']:.1f} %, "
                  f"time x{r['time_ratio']:.2f}")
        tg = targets(rat)
        for key, t in tg.items():
            print(f"target {key}: {t['ratio']:.3f} (target {'>=' if 'busbw' in key else '<='} "
                  f"{t['target']}) {'met' if t['met'] else 'NOT met'}")
        for note in notes:
            print(f"note: {note}")
        print(f"Check = {'PASSED' if passed else 'FAILED'} (every reduced value = n(n+1)/2)")
        if args.json:
            print(json.dumps({"benchmark": "allreduce", "ranks": comm.size, "device": backend.name(),
                              "gpu": placement.gpu_name, "dtype": args.dtype, "rows": rows,
                              "ratios": rat, "targets": tg, "notes": notes, "passed": passed,
                              "topic": "allreduce", "device_name": placement.gpu_name, "note": "; ".join(notes),
                              "figures": figures(rows, comm.size)}))
        sys.stdout.flush()
    return 0 if passed else 1
