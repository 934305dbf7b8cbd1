"""Convolution benchmarks (``python -m benchmarks conv ...``).

  throughput  one GPU: AlexNet C2 at batch 32 by each of our methods (the direct kernel at each tile
              shape, Winograd F(m x m, 5x5) at m = 2, 3, 4) against PyTorch in the same process:
              cuDNN with TF32 forbidden (true FP32, the target's baseline) and allowed, and unfold +
              cuBLAS SGEMM; timed back to back (one sync per 10 calls) and with a sync per call
  trunk       one GPU: AlexNet's whole trunk (C1-C5 with ReLU, max-pools, LRN) forward at batch 32 by our
              kernels (``run_device`` on one rank) against the same network and weights in PyTorch (cuDNN
              FP32, TF32 forbidden), timed as throughput's, per layer too; both checked against a float64
              NumPy trunk (exit status 1 where either differs); in :mod:`benchmarks.conv_trunk`
  scaling     under mpirun: one large layer split by height, strong (fixed height) and weak (fixed
              rows per rank), host-staged (V4) and GPU-to-GPU (V5) halos; one JSON line
  summarize   JSON lines of several scaling runs -> speedup / efficiency CSV

Targets: throughput >= 25 % of cuDNN FP32; trunk >= 50 % of cuDNN FP32 (its seconds / ours); strong-scaling
efficiency >= 0.90 at 4 GPUs; weak >= 0.95.
"""
from __future__ import annotations

import csv
import json
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

from hpclab import backend, comm as hcomm, roofline
from hpclab.comm import BACKENDS
from hpclab.device import identity, select_gpu
from hpclab.halo import conv as kc, conv_winograd
from hpclab.halo.bands import splitmix
from hpclab.halo.executors import Buffers, run_device
from hpclab.halo.layers import Conv
from hpclab.halo.measure import c2_operands
from hpclab.halo.reference import conv_flops, output_size
from hpclab.halo.versions import gpu_aware_backend, max_rel_error
from hpclab.launch import launch_1d, unravel4
from hpclab.mpi import world
from hpclab.options import Parser, count
from hpclab.results.recorded import figure
from hpclab.speedup import speedups
from hpclab.timing import Phases, wall

from benchmarks import conv_direct
from benchmarks.conv_trunk import trunk
from benchmarks.cudnn import conv_float64, gpu_times, timing_row, torch_precision

cuda = backend.cuda()
from numba import float32, uint64  # noqa: E402  (after the backend is chosen)

THROUGHPUT_TARGET, STRONG_TARGET, WEAK_TARGET = 0.25, 0.90, 0.95
COMPARISONS = ("cudnn_fp32", "cudnn_tf32", "torch_im2col_sgemm_fp32")


def throughput_figures(d: dict) -> list[dict]:
    """Our methods (the direct kernel's best tile shape) against cuDNN FP32, and the GPU's FP32 peak."""
    program, batch = f"conv-{d['layer'].lower()}", d["shape"][0]
    methods = {"direct": d["ours"].get(d["best_direct"], {}), **{k: v for k, v in d["ours"].items()
                                                                if not k.startswith("direct")}}
    methods.update({name: d[k] for k, name in (("cudnn_fp32", "cudnn-fp32"), ("cudnn_tf32", "cudnn-tf32"),
                                               ("torch_im2col_sgemm_fp32", "torch-sgemm-fp32")) if k in d})
    base = d.get("cudnn_fp32", {})
    rows = [figure(program, "fp32-peak", 1, batch, "images", "tflops", d["fp32_peak_tflops"], "TFLOP/s")] \
        if d.get("fp32_peak_tflops") else []
    for variant, m in ((v, m) for v, m in methods.items() if "tflops" in m):
        other = variant != "cudnn-fp32"
        rows += [figure(program, variant, 1, batch, "images", metric, m[metric], "TFLOP/s", "cudnn-fp32",
                        other and base.get(metric)) for metric in ("tflops", "latency_tflops")]
        rows.append(figure(program, variant, 1, batch, "images", "error", m["max_rel_error_vs_float64"], "1"))
    return rows


def throughput(args) -> int:
    """C2 at batch 32: our direct tiled kernel (:mod:`benchmarks.conv_direct`), the plain one, im2col + GEMM
    and Winograd; cuDNN in FP32 and TF32; one process."""
    x, wt = c2_operands(args.batch)
    (n, c, h, w), (k, _, r, _), stride, pad = x.shape, wt.shape, 1, 2
    ho = output_size(h, r, stride, pad)
    flops = conv_flops(n, k, c, r, r, ho, ho)
    xd, weights = cuda.to_device(x), kc.ConvWeights(wt)
    out = cuda.device_array((n, k, ho, ho), np.float32)
    # float64 reference of two images: how each method rounds (FP32 ~1e-6, TF32 ~1e-3)
    m = min(n, 2)
    want64 = conv_float64(x[:m], wt, stride, pad)
    err = lambda got: max_rel_error(got[:m], want64)  # noqa: E731

    device = identity()[0]
    peak = roofline.datasheet(device)               # its first figure: the FP32 FMA peak (no tensor cores)
    result = {"layer": "C2", "shape": [n, c, h, w], "weights": [k, c, r, r], "pad": pad, "gflop": flops / 1e9,
              "device": device, "fp32_peak_tflops": peak and peak[0] / 1e12, "ours": {},
              "tflops_note": "effective TFLOP/s = 2NKCRSPQ / time (direct-convolution operation count)"}
    configs = {"sim": conv_direct.SIM_CONFIG} if backend.is_simulator() else conv_direct.GPU_CONFIGS
    wdirect = conv_direct.device_weights(wt)
    calls = {f"direct {name}": (lambda cfg=cfg: conv_direct.conv_rows_tiled(
        xd, wdirect, weights.bias, out, stride, pad, pad, 0, ho, config=cfg)) for name, cfg in configs.items()}
    calls.update({name: (lambda name=name: kc.conv2d_device(xd, weights, stride, pad, out=out, method=name))
                  for name in ("naive", "gemm", "winograd")})          # Winograd: m = TILES[5]
    # The other Winograd tile sizes, in the same run: alpha^2 products per m^2 outputs (instead of 25 m^2).
    for tile in (2, 3, 4):
        if tile != conv_winograd.TILES[r]:
            u = cuda.to_device(conv_winograd.filter_transform(wt, tile))
            calls[f"winograd-f{tile}"] = (lambda u=u: conv_winograd.conv_rows_winograd(
                xd, u, weights.bias, out, r, pad, pad, 0, ho))
    for name, fn in calls.items():
        try:
            secs, latency = gpu_times(fn, args.repeats)
            fn()
            cuda.synchronize()
            result["ours"][name] = timing_row(flops, secs, latency, err(out.copy_to_host()))
        except Exception as exc:  # noqa: BLE001 - report and try the next one
            result["ours"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    timed = {k_: v for k_, v in result["ours"].items() if "seconds" in v}
    fastest = sorted(timed, key=lambda k_: timed[k_]["seconds"])
    result["best_direct"] = next((k_ for k_ in fastest if k_.startswith("direct")), None)
    result["best"] = best = next(iter(fastest), None)
    try:
        import torch
        import torch.nn.functional as F

        tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(wt).cuda()
        torch.backends.cudnn.benchmark = True        # cuDNN picks its fastest algorithm per setting
        conv = lambda: F.conv2d(tx, tw, stride=stride, padding=pad)  # noqa: E731
        wmat = tw.reshape(k, -1)     # unfold (im2col) + cuBLAS SGEMM: the same algorithm as our GEMM path
        unfold_mm = lambda: (wmat @ F.unfold(tx, r, padding=pad, stride=stride)).reshape(n, k, ho, ho)  # noqa: E731
        for label, fn, tf32 in (("cudnn_fp32", conv, False), ("cudnn_tf32", conv, True),
                                ("torch_im2col_sgemm_fp32", unfold_mm, False)):
            settings = torch_precision(torch, tf32)
            secs, latency = gpu_times(fn, args.repeats, warmup=3)
            result[label] = {**timing_row(flops, secs, latency, err(fn().cpu().numpy())), "settings": settings}
        result["torch"] = torch.__version__
        result["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:  # noqa: BLE001 - no PyTorch / no cuDNN: say so
        result["cudnn_error"] = f"{type(exc).__name__}: {exc}"
    if best:
        ours = timed[best]
        for label in (label for label in COMPARISONS if label in result):
            result[f"ratio_vs_{label}"] = result[label]["seconds"] / ours["seconds"]
            result[f"latency_ratio_vs_{label}"] = result[label]["latency_seconds"] / ours["latency_seconds"]
        if "ratio_vs_cudnn_fp32" in result:
            result["target"] = f"ours / cuDNN FP32 (TF32 off) >= {THROUGHPUT_TARGET}"
            result["target_met"] = result["ratio_vs_cudnn_fp32"] >= THROUGHPUT_TARGET
        peak = result["fp32_peak_tflops"]
        if peak and "cudnn_fp32" in result and result["cudnn_fp32"]["tflops"] > peak:
            result["cudnn_fp32_note"] = (
                f"cuDNN FP32 runs above the {peak:g} TFLOP/s FP32 peak in effective terms, with "
                f"FP32-level error {result['cudnn_fp32']['max_rel_error_vs_float64']:.1e}: it uses an "
                "algorithm with fewer multiplications (Winograd/FFT), not TF32")
    note = f"PyTorch {result['torch']}, cuDNN {result['cudnn']}" if "torch" in result else ""
    print(json.dumps({**result, "topic": "conv", "device_name": device, "note": note,
                      "figures": throughput_figures(result)}), flush=True)
    lines = {f"ours {name}": v for name, v in result["ours"].items()}
    lines.update({label: result[label] for label in COMPARISONS if label in result})
    for name, v in lines.items():
        said = (f"{v['tflops']:6.2f} TFLOP/s back to back, {v['latency_tflops']:6.2f} synchronised per call  "
                f"err {v['max_rel_error_vs_float64']:.1e}") if "seconds" in v else f"FAILED {v['error'][:200]}"
        print(f"C2 batch {n}: {name:<23} {said}", file=sys.stderr)
    return 0


_splitmix = cuda.jit(device=True)(splitmix)


@cuda.jit
def _hash_fill_kernel(out, seed, row0, height):
    _, C, rows, W = out.shape
    for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        n, c, h, w = unravel4(e, C, rows, W)
        out[n, c, h, w] = float32(_splitmix(uint64(((n * C + c) * height + row0 + h) * W + w), seed)) \
            * float32(2.0 ** -23) - float32(1.0)


def hash_fill(shape, seed: int, row0: int, height: int):
    """Device array: rows [row0, row0 + shape[2]) of a seeded (N, C, height, W) tensor, made on the GPU
    (:func:`hpclab.halo.bands.hash_values`' bits, without the host's memory for a large layer)."""
    out = cuda.device_array(tuple(shape), dtype=np.float32)
    blocks, threads = launch_1d(out.size)
    with warnings.catch_warnings():
        # The simulator runs the kernel on NumPy scalars, which warn when uint64
        # products wrap; wrapping is what the hash wants (as on the GPU).
        warnings.filterwarnings("ignore", "overflow encountered in scalar", RuntimeWarning)
        _hash_fill_kernel[blocks, threads](out, np.uint64(seed), row0, height)
    return out


def scaling(args) -> int:
    """One rank count: strong and weak runs of one large convolution layer.

    Timed: halo exchange + compute of each rank's band (input on the device, buffers reused), the
    slowest rank's time, median of ``repeats`` after two warm-up runs. Then one synchronised pass
    without overlap splits it into compute and halo exchange (which add up to that pass's time).
    """
    comm = world()
    select_gpu(comm)
    size, rank = comm.size, comm.rank
    c, k = backend.auto_size((96, 256), (4, 8))               # C2's channels (few on the simulator)
    r, pad, w, n = 5, 2, args.width, 1                          # C2's window, one image
    rng = np.random.default_rng(1)
    layer = Conv("big", rng.uniform(-0.1, 0.1, (k, c, r, r)).astype(np.float32),
                 np.zeros(k, np.float32), 1, pad, relu=True, method=None if args.method == "auto" else args.method)
    method = layer.runs
    backends = {"v4": hcomm.get("mpi-host", comm)}
    note5 = ""
    if size > 1:
        backends["v5"], note5 = gpu_aware_backend(comm, args.comm)
    rows = []
    for mode, height in (("strong", args.height), ("weak", args.rows_per_rank * size)):
        r0, r1 = hcomm.block_range(height, size, rank)
        x = hash_fill((n, c, r1 - r0, w), 5, r0, height)
        buffers = Buffers()
        cuda.synchronize()
        flops = conv_flops(n, k, c, r, r, output_size(height, r, 1, pad), output_size(w, r, 1, pad))
        for version, be in backends.items():
            def once(phases=None):     # run_device ends with a stream sync
                return wall(lambda: run_device([layer], x, comm, be, True, phases, buffers, height), comm, False)[2]

            for _ in range(2):
                once()                                        # compile, fill the buffers
            median = statistics.median([once() for _ in range(args.repeats)])
            split = Phases(sync=True)
            split_wall = once(split)
            phases = split.max_over_ranks(comm)
            rows.append({"mode": mode, "version": version, "comm": be.name, "method": method, "overlap": True,
                         "ranks": size, "height": height, "width": w, "batch": n, "channels": c,
                         "out_channels": k, "kernel": r, "wall_s": median, "tflops": flops / median / 1e12,
                         "compute_s": phases.get("compute", 0.0), "halo_s": phases.get("halo", 0.0),
                         "split_wall_s": split_wall})
        x = buffers = None                                    # freed before the next mode's
    if rank == 0:
        print(json.dumps({"ranks": size, "device": identity()[0], "note": note5, "runs": rows}), flush=True)
    return 0


def summarize(args) -> int:
    """Scaling JSON lines -> CSV with speedup and efficiency against the 1-rank run."""
    found = [json.loads(line) for path in args.files for line in Path(path).read_text().splitlines()
             if line.strip().startswith("{") and '"runs"' in line]
    runs = [run for d in found for run in d["runs"]]
    device = next((d["device"] for d in reversed(found) if "device" in d), "")
    if not runs:
        print("no scaling results found", file=sys.stderr)
        return 1
    base = {(r["mode"], r["version"], r["overlap"]): r["wall_s"] for r in runs if r["ranks"] == 1}
    base.update({(m, "v5", o): t for (m, v, o), t in list(base.items()) if v == "v4"})  # 1 rank: no halo
    out, figures = [], []
    for r in sorted(runs, key=lambda r: (r["mode"], r["version"], not r["overlap"], r["ranks"])):
        t1 = base.get((r["mode"], r["version"], r["overlap"]))
        if t1 is None:
            continue
        speedup, eff = speedups([1, r["ranks"]], [t1, r["wall_s"]], r["mode"])[-1]
        kept = ("mode", "version", "comm", "overlap", "ranks", "height", "wall_s", "tflops", "compute_s", "halo_s",
                "split_wall_s")
        out.append({**{k: r[k] for k in kept}, "speedup": speedup, "efficiency": eff})
        for comm in (["mpi-host", "nccl"] if r["ranks"] == 1 else [r["comm"]]):   # 1 GPU: the base of both curves
            figures += [figure("conv-halo", f"{r['mode']}-{comm}", r["ranks"], r["height"], "rows", metric,
                               out[-1][metric], "1" if metric == "efficiency" else "s")
                        for metric in ("wall_s", "compute_s", "halo_s", "efficiency")]
    with open(args.csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(out[0]))
        writer.writeheader()
        writer.writerows(out)
    for row in out:
        target = STRONG_TARGET if row["mode"] == "strong" else WEAK_TARGET
        flag = "" if row["ranks"] == 1 else (" ok" if row["efficiency"] >= target else f" BELOW {target}")
        print(f"{row['mode']:<6} {row['version']} ({row['comm']}) {row['ranks']} GPU(s): {row['wall_s']:.4f} s "
              f"{row['tflops']:.1f} TFLOP/s | split pass {row['split_wall_s']:.4f} s = compute "
              f"{row['compute_s']:.4f} + halo {row['halo_s']:.4f} | speedup {row['speedup']:.2f} "
              f"efficiency {row['efficiency']:.3f}{flag}")
    print(json.dumps({"topic": "conv", "device_name": device, "figures": figures}))
    return 0


def main(argv: list[str]) -> int:
    side = count(1, (1 << 31) - 1)
    parser = Parser(prog="python -m benchmarks conv", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput", help="C2 at batch 32 against cuDNN")
    t.add_argument("--batch", type=count(1, 1 << 16), default=32)
    t.add_argument("--repeats", type=count(1, 10**4), default=10)
    tr = sub.add_parser("trunk", help="AlexNet's whole trunk forward against PyTorch (cuDNN FP32)")
    tr.add_argument("--batch", type=count(1, 1 << 16), default=None, help="images (default 32; 2 on the simulator)")
    tr.add_argument("--repeats", type=count(1, 10**4), default=None,
                    help="timed turns (default 10; 1 on the simulator)")
    tr.add_argument("--method", default="auto", choices=("auto", *kc.METHODS),
                    help="our convolutions (auto: each layer's default, Winograd where it applies and GEMM on C1; "
                         "naive on the simulator; winograd: GEMM on C1)")
    s = sub.add_parser("scaling", help="strong and weak scaling of one large layer (run under mpirun)")
    s.add_argument("--height", type=side, default=32768, help="strong scaling: input rows")
    s.add_argument("--rows-per-rank", type=side, default=8192, help="weak scaling: rows per rank")
    s.add_argument("--width", type=side, default=256)
    s.add_argument("--repeats", type=count(1, 10**4), default=5)
    s.add_argument("--method", default="auto", choices=("auto", *kc.METHODS),
                   help="convolution on the GPU (auto: winograd on a GPU, naive on the simulator)")
    s.add_argument("--comm", default="auto", choices=BACKENDS, help="V5's backend: auto, nccl, mpi-cuda")
    m = sub.add_parser("summarize", help="scaling JSON lines -> CSV with speedup and efficiency")
    m.add_argument("files", nargs="+")
    m.add_argument("--csv", default="conv_scaling.csv")
    args = parser.parse_args(argv)
    return {"trunk": trunk, "throughput": throughput, "scaling": scaling, "summarize": summarize}[args.what](args)
