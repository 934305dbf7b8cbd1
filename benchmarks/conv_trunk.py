"""``python -m benchmarks conv trunk``: AlexNet's whole trunk (C1-C5, ReLU, max-pools, LRN) forward on one GPU, our
kernels against the same network in PyTorch (cuDNN FP32), both checked against a float64 NumPy trunk.

Ours is :func:`hpclab.halo.executors.run_device` on a one-rank communicator (no mpirun needed) with its
buffers kept between calls, so no allocation is timed; one rank queues all its layers and waits once. Timed
as ``throughput`` is, back to back and synchronised per call (:func:`benchmarks.cudnn.gpu_times`).
"""
from __future__ import annotations

import functools
import json
import sys

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hpclab import backend
from hpclab.device import identity
from hpclab.halo import alexnet, conv as kc, conv_winograd
from hpclab.halo.executors import Buffers, run_device
from hpclab.halo.layers import LRN, Conv, Pool
from hpclab.halo.run import FULL_INPUT, SIM_INPUT, SIM_SCALE
from hpclab.halo.versions import max_rel_error
from benchmarks.cudnn import conv_float64, gpu_times, timing_row, torch_precision
from hpclab.mpi import MPI
from hpclab.results.recorded import figure

TRUNK_TARGET = 0.5      # cuDNN FP32 seconds / ours, the whole trunk forward
TOLERANCE = 1e-4          # max error relative to max |float64 trunk| (float32 sums in another order)


def torch_lrn_args(op: LRN) -> tuple:
    """(size, alpha, beta, k) for PyTorch's ``local_response_norm`` to compute ``reference.lrn``: PyTorch averages
    the squares over ``size`` channels (zeros past the edges) where AlexNet sums them, hence alpha * size; its
    window c - size//2 .. c + (size-1)//2 is ours, c - size//2 .. c + size//2, for an odd size only."""
    if op.size % 2 == 0:
        raise ValueError(f"LRN size {op.size}: PyTorch's window of an even size is not this LRN's")
    return op.size, op.alpha * op.size, op.beta, op.k


def trunk_float64(ops, x) -> np.ndarray:
    """The chain of Conv/Pool/LRN ops in float64 (convolutions through BLAS): the yardstick for both float32 runs."""
    y = x.astype(np.float64)
    for op in ops:
        if isinstance(op, Conv):
            y = conv_float64(y, op.w, op.stride, op.pad) + op.bias[:, None, None]
            y = np.maximum(y, 0.0) if op.relu else y
        elif isinstance(op, Pool):
            y = sliding_window_view(y, (op.size, op.size), axis=(2, 3))[:, :, ::op.stride, ::op.stride].max(axis=(4, 5))
        else:                   # LRN: channels c - size//2 .. c + size//2, as reference.lrn
            half = op.size // 2
            sq = np.pad(y * y, ((0, 0), (half, half), (0, 0), (0, 0)))
            y = y / (op.k + op.alpha * sliding_window_view(sq, 2 * half + 1, axis=1).sum(axis=-1)) ** op.beta
    return y


def _layer_seconds(layers, x, repeats: int, **kw) -> list[float]:
    """Back-to-back seconds of each layer (a function of its input) on the previous layer's output."""
    seconds = []
    for layer in layers:
        seconds.append(gpu_times(lambda: layer(x), repeats, **kw)[0])  # noqa: B023 - timed before x changes
        x = layer(x)
    return seconds


def _torch_layers(torch, ops) -> list:
    """Each op as a function of a tensor in PyTorch, from the same weights."""
    import torch.nn.functional as F

    def layer(op):
        if isinstance(op, Pool):
            return lambda t: F.max_pool2d(t, op.size, op.stride)
        if isinstance(op, LRN):
            return lambda t: F.local_response_norm(t, *torch_lrn_args(op))
        wt, bias = torch.from_numpy(op.w).cuda(), torch.from_numpy(op.bias).cuda()

        def conv(t):
            t = F.conv2d(t, wt, bias, op.stride, op.pad)
            return F.relu(t, inplace=True) if op.relu else t
        return conv

    return [layer(op) for op in ops]


def trunk_figures(d: dict) -> list[dict]:
    """Ours and cuDNN FP32: seconds per pass, images/s (ours against cuDNN's: the target's ratio), error, and each
    layer's seconds back to back (metric ``<layer>_seconds``)."""
    batch, base = d["shape"][0], d.get("cudnn_fp32", {})
    rows = []
    for variant, m, per_layer in ((f"ours-{d['method']}", d["ours"], "ours_seconds"),
                                  ("cudnn-fp32", base, "cudnn_fp32_seconds")):
        if not m:
            continue
        fig = functools.partial(figure, "conv-trunk", variant, 1, batch, "images")
        rows += [fig(metric, m[metric], "s") for metric in ("seconds", "latency_seconds")]
        rows += [fig(metric, m[metric], "images/s", "cudnn-fp32", variant != "cudnn-fp32" and base.get(metric))
                 for metric in ("images_per_s", "latency_images_per_s")]
        rows.append(fig("error", m["max_rel_error_vs_float64"], "1"))
        rows += [fig(f"{layer['layer']}_seconds", layer[per_layer], "s")
                 for layer in d.get("layers", ()) if per_layer in layer]
    return rows


def _setup(args):
    """The trunk's ops (seeded weights; run.py's reduced trunk on the simulator) and a seeded input batch."""
    scale = backend.auto_size(1, SIM_SCALE)
    n = args.batch or backend.auto_size(32, 2)
    h, w = backend.auto_size(FULL_INPUT["trunk"], SIM_INPUT["trunk"])
    ops = alexnet.trunk_ops(scale, seed=0)
    for op in ops:      # winograd: where the layer allows it (stride 1, 3x3 or 5x5), GEMM on C1
        if isinstance(op, Conv):
            cannot = args.method == "winograd" and conv_winograd.supported(*op.w.shape[2:], op.stride)
            op.method = "gemm" if cannot else None if args.method == "auto" else args.method
    x = np.random.default_rng(0).uniform(-1, 1, (n, alexnet.INPUT[0], h, w)).astype(np.float32)
    return ops, x, scale


def trunk(args) -> int:
    """Ours and PyTorch's forward pass, timed in the same process; 0 where both match the float64 trunk."""
    cuda, sim = kc.cuda, backend.is_simulator()
    ops, x, scale = _setup(args)
    n, c, h, w = x.shape
    repeats = args.repeats or backend.auto_size(10, 1)
    quick = {"warmup": 0, "queued": 1} if sim else {}      # the simulator: one call a turn (its times mean nothing)
    m = min(n, 2)
    want64 = trunk_float64(ops, x[:m])                     # two images: the check, not the benchmark
    flops = sum(row["flops"] for row in alexnet.layer_table(ops, (c, h, w), n))

    def timing(secs, latency, got) -> dict:
        err = max_rel_error(got[:m], want64)
        return {**timing_row(flops, secs, latency, err), "images_per_s": n / secs, "latency_images_per_s": n / latency,
                "ok": err <= TOLERANCE}

    one = MPI().COMM_SELF
    xd, buffers = cuda.to_device(x), Buffers()
    cuda.synchronize()                                     # run_device's streams do not wait for the copy
    forward = lambda: run_device(ops, xd, one, buffers=buffers)  # noqa: E731
    ours_out = forward().copy_to_host()                    # compiles the kernels, fills the buffers
    device = identity()[0]
    result = {"layer": "trunk", "shape": [n, c, h, w], "output": list(ours_out.shape[1:]), "scale": scale,
              "device": device, "method": args.method,
              "methods": {op.name: op.runs for op in ops if isinstance(op, Conv)}, "gflop": flops / 1e9,
              "simulator_reduced": sim, "checked_images": m, "tolerance": TOLERANCE,
              "ours": timing(*gpu_times(forward, repeats, **quick), ours_out)}
    ours_layers = [functools.partial(run_device, [op], comm=one, buffers=Buffers()) for op in ops]
    result["layers"] = [{"layer": op.name, "op": op.describe(), "ours_seconds": s}
                        for op, s in zip(ops, _layer_seconds(ours_layers, xd, repeats, **quick))]
    try:
        import torch

        layers, tx = _torch_layers(torch, ops), torch.from_numpy(x).cuda()
        tforward = lambda: functools.reduce(lambda t, layer: layer(t), layers, tx)  # noqa: E731
        torch.backends.cudnn.benchmark = True             # cuDNN picks its fastest algorithm per layer
        settings = torch_precision(torch, False)
        torch_out = tforward().cpu().numpy()
        result["cudnn_fp32"] = {**timing(*gpu_times(tforward, repeats, warmup=3), torch_out), "settings": settings,
                                "max_rel_error_vs_ours": max_rel_error(ours_out, torch_out)}
        for row, s in zip(result["layers"], _layer_seconds(layers, tx, repeats)):
            row["cudnn_fp32_seconds"] = s
        result["torch"], result["cudnn"] = torch.__version__, torch.backends.cudnn.version()
    except Exception as exc:  # noqa: BLE001 - no PyTorch / no cuDNN: say so
        result["cudnn_error"] = f"{type(exc).__name__}: {exc}"
    runs = {"ours": result["ours"], **({"cudnn_fp32": result["cudnn_fp32"]} if "cudnn_fp32" in result else {})}
    if "cudnn_fp32" in result:
        base, ours = result["cudnn_fp32"], result["ours"]
        result["ratio_vs_cudnn_fp32"] = base["seconds"] / ours["seconds"]
        result["latency_ratio_vs_cudnn_fp32"] = base["latency_seconds"] / ours["latency_seconds"]
        result["target"] = f"cuDNN FP32 (TF32 off) seconds / ours >= {TRUNK_TARGET}"
        result["target_met"] = result["ratio_vs_cudnn_fp32"] >= TRUNK_TARGET
    result["passed"] = all(r["ok"] for r in runs.values())   # cuDNN's too: else it timed another function
    note = f"PyTorch {result['torch']}, cuDNN {result['cudnn']}" if "torch" in result else ""
    print(json.dumps({**result, "topic": "conv", "device_name": device, "note": note,
                      "figures": trunk_figures(result)}), flush=True)
    _summary(result, runs)
    return 0 if result["passed"] else 1


def _summary(d: dict, runs: dict) -> None:
    say = functools.partial(print, file=sys.stderr)
    n, c, h, w = d["shape"]
    say(f"AlexNet trunk on {d['device']}: batch {n}, input {c}x{h}x{w}, output {'x'.join(map(str, d['output']))}, "
        f"{d['gflop'] / n:.3g} GFLOP per image" + (f" (simulator: channels / {d['scale']})" if d["scale"] > 1 else ""))
    for label, r in runs.items():
        name = f"ours ({d['method']})" if label == "ours" else "cuDNN FP32"
        say(f"  {name:<16} {r['seconds']:.4g} s back to back, {r['latency_seconds']:.4g} s synchronised per call, "
            f"{r['images_per_s']:.4g} images/s | error vs float64 ({d['checked_images']} images) "
            f"{r['max_rel_error_vs_float64']:.1e} " + ("ok" if r["ok"] else f"ABOVE {TOLERANCE:g}"))
    if "cudnn_error" in d:
        say(f"  cuDNN FP32       not run: {d['cudnn_error'][:200]}")
    else:
        say(f"  cuDNN FP32 seconds / ours: {d['ratio_vs_cudnn_fp32']:.3f} back to back, "
            f"{d['latency_ratio_vs_cudnn_fp32']:.3f} synchronised (target >= {TRUNK_TARGET}: "
            f"{'met' if d['target_met'] else 'NOT met'}); the outputs differ by "
            f"{d['cudnn_fp32']['max_rel_error_vs_ours']:.1e}")
    both = "cudnn_fp32" in d
    say(f"  per layer, ms back to back (ours{' / cuDNN FP32' if both else ''}): " + ", ".join(
        f"{row['layer']} {row['ours_seconds'] * 1e3:.3g}" + (f"/{row['cudnn_fp32_seconds'] * 1e3:.3g}" if both else "")
        for row in d["layers"]))
