"""``python -m benchmarks matmul``: the Numba kernels against cuBLAS, in one run, on one GPU.

    python -m benchmarks matmul --sizes 4096,8192,4095,3000x5000x700 [--layouts nn,tn,nt] [--json] [--out FILE]
    python -m benchmarks matmul --no-sweep --random 24 --seed 1      (24 shapes drawn at random)

For each size (float32; N is an N x N x N product, MxNxK an M x K by K x N one): the naive kernel
(the smallest product only, up to 4096: it is slow), the tiled kernel, candidate tile shapes of
the fast and warp kernels, and cuBLAS SGEMM through CuPy when it imports. Reported: TFLOP/s, the
ratio to cuBLAS (timed in turns with each kernel, kernel, cuBLAS, kernel, ...: a kernel timed
minutes after cuBLAS may meet other clocks) and to the FP32 peak, a correctness check against
cuBLAS (or NumPy), and per configuration the registers, shared and local memory (spills) and the
occupancy that follows. ``--layouts tn,nt`` also times each size with A (tn) or B (nt) stored transposed and
read in place, as a dense layer's backward products are (the fast and warp kernels and cuBLAS only; such a
shape's key ends in its layout: ``4096x4096x512-tn``). ``--random 24`` adds 24 shapes drawn at random (each side
log-uniform from 8 to 65536, 2^30 <= M*N*K <= 2^35; ``--seed`` picks them): "any shape", not chosen ones. On the
simulator it runs tiny sizes: the figures say nothing about speed.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import re
import sys
from pathlib import Path

import numpy as np

from hpclab import backend
from hpclab.options import Parser, count, count_list
from hpclab.results.recorded import figure
from hpclab.matmul.measure import device_info, operands
from hpclab.timing import median_time, median_times

# Candidate tile shapes for the sweep: (bm, bn, bk, tm, tn, vec, pad) of the fast kernel ...
CANDIDATES = [(128, 128, 8, 8, 8, 4, 4), (128, 128, 16, 8, 8, 4, 4), (128, 128, 8, 8, 8, 1, 4),
              (128, 128, 8, 8, 8, 4, 0), (64, 128, 8, 8, 8, 4, 4), (128, 64, 8, 8, 4, 4, 4), (64, 64, 8, 4, 4, 4, 4),
              (128, 128, 16, 8, 8, 1, 4)]
# ... and (bm, bn, bk, wm, wn, mi, ni[, pad]) of the warp-tiled one (four-warp blocks last, the narrow C's at the end).
WARP_CANDIDATES = [(128, 128, 16, 32, 64, 2, 2), (128, 128, 16, 64, 32, 2, 2), (128, 128, 16, 32, 64, 2, 2, 0),
                   (128, 128, 16, 32, 64, 2, 2, 8), (128, 128, 8, 32, 64, 2, 2), (128, 256, 16, 64, 64, 4, 2),
                   (64, 128, 16, 32, 64, 2, 2), (128, 64, 16, 32, 64, 2, 2), (256, 32, 16, 64, 32, 2, 2),
                   (32, 128, 16, 32, 32, 1, 2)]
TOLERANCE = 1e-4          # max |C - cuBLAS| / max |cuBLAS| accepted for float32
NAIVE_MAX = 4096          # the largest N the naive kernel runs at (it is slow)


def _shape(text: str) -> tuple[int, int, int]:
    """'4096' -> (4096, 4096, 4096); '3000x5000x700' -> (M, N, K) = (3000, 5000, 700)."""
    parts = str(text).lower().split("x")
    if len(parts) not in (1, 3):
        raise argparse.ArgumentTypeError(f"{text!r} is neither N nor MxNxK (e.g. 4096 or 3000x5000x700)")
    return tuple([count(1, 1 << 17)(p) for p in parts] * (3 // len(parts)))


def _sizes(text: str) -> tuple:
    items = str(text).split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item; give a comma list such as 4096,3000x5000x700")
    return tuple(_shape(item.strip()) for item in items)


GPU_SIZES = ((4096,) * 3, (8192,) * 3, (4095,) * 3, (3000, 5000, 700))
# --random draws M, N, K log-uniformly from these sides, keeping products of at least 2^30 multiply-adds (the
# target's "any shape") and at most 2^35 (seconds a shape); on the simulator, sides a slow interpreter can run.
RANDOM_RANGE = {"gpu": (8, 65536, 2 ** 30, 2 ** 35), "sim": (1, 40, 1, 2 ** 12)}    # by backend.name()


def random_shapes(count: int, seed: int, lo: int, hi: int, least: int, most: int) -> list[tuple[int, int, int]]:
    """``count`` shapes (M, N, K), each side log-uniform in [lo, hi], kept when least <= M*N*K <= most."""
    rng, shapes = np.random.default_rng(seed), []
    while len(shapes) < count:
        m, n, k = (int(x) for x in np.exp(rng.uniform(np.log(lo), np.log(hi + 1), 3)))
        if least <= m * n * k <= most:
            shapes.append((m, n, k))
    return shapes


LAYOUTS = ("nn", "tn", "nt", "tt")     # op(A) op(B): n as stored, t read transposed in place


def _layouts(text: str) -> tuple:
    items = tuple(dict.fromkeys(x.strip().lower() for x in str(text).split(",")))
    bad = [x for x in items if x not in LAYOUTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown layout {', '.join(map(repr, bad))}; "
                                         f"choose from {', '.join(LAYOUTS)}")
    return items


def sm_limits(cuda) -> dict:
    """The registers, shared memory, threads and blocks one SM holds (what :func:`resources` needs for the
    occupancy); empty where the driver does not say."""
    dev = cuda.get_current_device()

    def attr(name):
        try:
            return getattr(dev, f"MAX_{name}_PER_MULTIPROCESSOR")
        except Exception:  # noqa: BLE001 - attributes come and go between CUDA versions
            return None

    values = {k: attr(v) for k, v in (("regs_per_sm", "REGISTERS"), ("smem_per_sm", "SHARED_MEMORY"),
                                      ("threads_per_sm", "THREADS"), ("blocks_per_sm", "BLOCKS"))}
    return values if all(values.values()) else {}


def resources(kernel, threads: int, dev: dict) -> dict:
    """Registers, shared and local memory of a compiled kernel, and the occupancy they allow."""
    def one(value):
        # A dispatcher answers with a dict keyed by signature; each kernel here has one.
        return int(next(iter(value.values())) if isinstance(value, dict) else value)

    out = {}
    try:
        out["regs_per_thread"] = one(kernel.get_regs_per_thread())
        out["shared_bytes_per_block"] = one(kernel.get_shared_mem_per_block())
        out["local_bytes_per_thread"] = one(kernel.get_local_mem_per_thread())
    except Exception as exc:  # noqa: BLE001 - the simulator has none of these
        return {"note": f"no resource figures ({type(exc).__name__})"}
    if "regs_per_sm" not in dev:
        return out
    regs_block = ((out["regs_per_thread"] * 32 + 255) // 256 * 256) * ((threads + 31) // 32)
    smem = out["shared_bytes_per_block"]
    limits = {"registers": dev["regs_per_sm"] // max(regs_block, 1), "threads": dev["threads_per_sm"] // threads,
              "shared memory": dev["smem_per_sm"] // smem if smem else 99, "blocks": dev["blocks_per_sm"]}
    blocks = min(limits.values())
    out.update(blocks_per_sm=blocks, warps_per_sm=blocks * threads // 32,
               occupancy=blocks * threads / dev["threads_per_sm"],
               limited_by=min(limits, key=limits.get))
    return out


def sass_counts(kernel) -> dict:
    """Instruction counts in the SASS (needs nvdisasm; empty if unavailable)."""
    try:
        sass = kernel.inspect_sass()
    except Exception:  # noqa: BLE001
        return {}
    text = sass if isinstance(sass, str) else "\n".join(sass.values())
    ops = ["FFMA", "DFMA", "LDS.128", "LDS.64", "LDS ", "LDG", "STS", "IMAD", "IADD3", "BAR", "STL", "LDL"]
    return {op.strip(): text.count(op) for op in ops}


RESOURCES = {"regs_per_thread": "registers", "shared_bytes_per_block": "B", "local_bytes_per_thread": "B",
             "blocks_per_sm": "blocks", "warps_per_sm": "warps", "occupancy": "1"}


def figures(d: dict) -> list[dict]:
    """The run's figures (``hpclab.results.recorded.figure``): each kernel and tile shape against the cuBLAS
    timed in turns with it, and its resources and SASS counts. An M x N x K shape's figures are sized by M,
    their variant ending in the shape (``warp-at-3000x5000x700``)."""
    rows = []
    for key, block in [*d["sizes"].items(), *d.get("shapes", {}).items()]:
        shape = "x" in key
        size, unit_of_size = int(key.split("x")[0]), "M" if shape else "N"
        cublas = next((r["tflops"] for r in block["rows"] if r["kernel"] == "cublas"), None)
        for r in (r for r in block["rows"] if "tflops" in r):
            variant = r["kernel"]
            if block.get(f"default_{variant}_config", d.get(f"default_{variant}_config")) not in (None, r["config"]):
                variant = f"{variant}-{re.sub(r'[^A-Za-z0-9.]+', '-', r['config']).strip('-')}"
            variant += f"-at-{key}" if shape else ""
            fig = functools.partial(figure, "matmul", variant, 1, size, unit_of_size)
            base = r.get("cublas_tflops", cublas) if r["kernel"] != "cublas" else None
            rows.append(fig("tflops", r["tflops"], "TFLOP/s", "cublas", base))
            rows += [fig(k, r[k], unit) for k, unit in RESOURCES.items() if k in r]
            rows += [fig(f"sass_{op}", n, "instructions") for op, n in r.get("sass", {}).items()]
    return rows


def main(argv=None) -> int:
    p = Parser(prog="python -m benchmarks matmul", description=__doc__)
    p.add_argument("--sizes", type=_sizes, default=None,
                   help="comma-separated N or MxNxK (default 4096,8192,4095,3000x5000x700 on a GPU, "
                        "32,33x20x17 on the simulator)")
    p.add_argument("--repeats", type=count(1, 10**6), default=None,
                   help="timed runs per kernel (median; default 20 at N <= 4096, else 10; naive 2, tiled 3)")
    p.add_argument("--no-sweep", action="store_true", help="only the default fast configuration")
    p.add_argument("--splits", type=count_list(1, 1024, example="1,2,4,8"), default=None,
                   help="also run the warp kernel's three tile shapes for a C at least 64 wide each way with K "
                        "in these many slices")
    p.add_argument("--layouts", type=_layouts, default=("nn",),
                   help="comma-separated operand layouts to time: nn (default), tn (A stored transposed), nt, tt")
    p.add_argument("--random", type=count(0, 1000), default=0,
                   help="also time this many shapes drawn at random: each side log-uniform from 8 to 65536, "
                        "2^30 <= M*N*K <= 2^35 (on the simulator, tiny ones)")
    p.add_argument("--seed", type=count(0, 2 ** 32 - 1), default=0, help="seed of --random's shapes (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    backend.select()
    from hpclab.matmul import fast as mm, naive, split_k, tiled, warp     # loads numba.cuda: after the backend choice

    cuda = mm.cuda
    sim = backend.is_simulator()
    drawn = random_shapes(args.random, args.seed, *RANDOM_RANGE[backend.name()])
    sizes = list(args.sizes or ([] if drawn else [(32,) * 3, (33, 20, 17)] if sim else GPU_SIZES))
    sizes += [s for s in drawn if s not in sizes]
    dev = device_info(cuda) | ({} if sim else sm_limits(cuda))
    cp = None
    if not sim:
        try:
            import cupy as cp
        except Exception as exc:  # noqa: BLE001
            print(f"cuBLAS comparison skipped: CuPy not importable ({type(exc).__name__}: {exc})")
    peak = dev.get("fp32_peak_tflops")
    print(f"device: {dev['name']}" + (f", FP32 peak {peak:.1f} TFLOP/s ({dev['sms']} SMs x "
                                      f"{dev['fp32_lanes_per_sm']} lanes x 2 x {dev['clock_ghz']:.2f} GHz)"
                                      if peak else (" (timings are not meaningful)" if sim else
                                                    " (FP32 peak unknown: no clock rate)")))
    f32 = np.dtype(np.float32)
    default = mm.fast_config(f32)
    configs, warp_sweep = [default], []
    if not sim and not args.no_sweep:
        configs += [mm.FastConfig(*c) for c in CANDIDATES if mm.FastConfig(*c) != default]
        warp_sweep = [warp.WarpConfig(*c) for c in WARP_CANDIDATES]
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python -m benchmarks matmul " + " ".join(sys.argv[1:] if argv is None else argv),
              "backend": backend.name(), "device": dev, "device_name": dev["name"],
              "default_fast_config": default.label(), "default_warp_config": warp.CONFIG.label(),   # per size below
              "random_shapes": [f"{m}x{n}x{k}" for m, n, k in drawn],
              "sizes": {}, "shapes": {}}   # square sizes (N), other shapes (MxNxK)
    smallest = min(sizes, key=lambda s: s[0] * s[1] * s[2])
    for (m, n, k), layout in ((size, layout) for size in sizes for layout in args.layouts):
        rng, a_h, b_h, a, b, c = operands(cuda, m, n, k)
        ta, tb = layout[0] == "t", layout[1] == "t"
        if ta:       # the same product with A (B) stored transposed: op(a) = a.T
            a = cuda.to_device(np.ascontiguousarray(a_h.T))
        if tb:
            b = cuda.to_device(np.ascontiguousarray(b_h.T))
        chosen, split = warp.plan(m, n, k, ta or tb)     # what launch() runs at this shape: the default row
        # (tile shape, slices of K) of each warp row: the plan's, each swept shape with the plan's slicing for it,
        # and with --splits each of the three tile shapes launch() chooses from for a C at least 64 wide each way,
        # at those slice counts
        warp_rows = [(chosen, split)] + [split_k.planned(m, n, k, (cfg,)) for cfg in warp_sweep
                                         if cfg != chosen and layout == "nn"]
        warp_rows += [(cfg, split_k.slices(k, cfg.bk, s)[0])
                      for cfg in dict.fromkeys([warp.CONFIG, warp.SHALLOW, warp.SHORT]) for s in args.splits or ()]
        warp_rows = list(dict.fromkeys(warp_rows))
        planned = warp_label(chosen, split)
        flop = mm.flops(m, k, n)
        reps = args.repeats or (2 if sim else (20 if flop <= mm.flops(4096, 4096, 4096) else 10))
        rows, reference, cublas_fn = [], None, None
        if cp is not None:
            a_cp, b_cp = cp.asarray(a), cp.asarray(b)
            a_cp, b_cp = a_cp.T if ta else a_cp, b_cp.T if tb else b_cp      # transposed views: cuBLAS's op flags
            reference = out_cp = cp.empty((m, n), dtype=cp.float32)
            cublas_fn = lambda: cp.matmul(a_cp, b_cp, out=out_cp)  # noqa: E731
            t = median_time(cublas_fn, repeats=reps, warmup=2)
            rows.append({"kernel": "cublas", "config": "CuPy matmul (cuBLAS SGEMM)", "seconds": t,
                         "tflops": flop / t / 1e12})
        else:
            sample = rng.choice(m, size=min(m, 64), replace=False)
            ref_rows = a_h[sample].astype(np.float64) @ b_h.astype(np.float64)

        def check(c_dev) -> float:
            """Max |C - reference| / max |reference|."""
            if reference is not None:
                diff = cp.abs(cp.asarray(c_dev) - reference).max()
                return float(diff / cp.abs(reference).max())
            got = c_dev.copy_to_host()[sample]
            return float(np.abs(got - ref_rows).max() / np.abs(ref_rows).max())

        plan = []
        if max(m, n, k) <= NAIVE_MAX and (m, n, k) == smallest and layout == "nn":
            plan.append(("naive", None, max(1, min(reps, 2))))
        if layout == "nn":
            plan.append(("tiled", None, max(1, min(reps, 3))))
        plan += [("fast", cfg, reps) for cfg in (configs if layout == "nn" else [default])]
        plan += [("warp", cfg, reps) for cfg in warp_rows]
        for kernel, cfg, r in plan:
            row = {"kernel": kernel, "config": warp_label(*cfg) if kernel == "warp" else cfg.label() if cfg else
                   (f"{tiled.TILE}x{tiled.TILE} tiles" if kernel == "tiled" else "one output per thread")}
            try:
                if kernel == "warp":
                    fn = lambda: warp.launch(a, b, c, cfg[0], split=cfg[1], trans_a=ta, trans_b=tb)  # noqa: E731
                else:
                    fn = lambda: mm.launch(kernel, a, b, c, config=cfg, trans_a=ta, trans_b=tb)  # noqa: E731
                if cublas_fn is None:
                    t = median_time(fn, repeats=r, warmup=1)
                else:   # cuBLAS in turns with the kernel: the ratio compares like clocks with like
                    t, t_ref = median_times(fn, cublas_fn, repeats=r, warmup=1)
                    row["cublas_tflops"] = flop / t_ref / 1e12
                err = check(c)
                row.update(seconds=t, tflops=flop / t / 1e12, max_rel_error=err, correct=err <= TOLERANCE)
                fast_split = mm.auto_split(a, c, ta, cfg) if kernel == "fast" else 1
                compiled = (warp.kernel_for(a, b, c, cfg[0], cfg[1] > 1, ta, tb) if kernel == "warp" else
                            mm.fast_kernel(f32, cfg, ta, tb, split=fast_split) if kernel == "fast" else
                            naive.naive_kernel if kernel == "naive" else tiled.tiled_kernel)
                threads = (cfg[0] if kernel == "warp" else cfg).threads if cfg else (
                    naive.BLOCK ** 2 if kernel == "naive" else tiled.TILE ** 2)
                row.update(resources(compiled, threads, dev))
                if cfg in (default, (chosen, split)) and (m, n, k) == sizes[0] and layout == "nn":
                    row["sass"] = sass_counts(compiled)
            except Exception as exc:  # noqa: BLE001 - one bad configuration must not end the sweep
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            rows.append(row)
        cublas = next((r["tflops"] for r in rows if r["kernel"] == "cublas"), None)
        for row in rows:
            if "tflops" in row:
                if cublas:
                    row["vs_cublas"] = row["tflops"] / row.get("cublas_tflops", cublas)
                if peak:
                    row["vs_peak"] = row["tflops"] / peak
        summary = {"rows": rows, "default_warp_config": planned}
        best = {}
        for kernel, label in (("fast", default.label()), ("warp", planned)):
            mine = [r for r in rows if r["kernel"] == kernel and "tflops" in r]
            best[kernel] = max(mine, key=lambda r: r["tflops"]) if mine else None
            summary.update({f"best_{kernel}": best[kernel] and best[kernel]["config"],
                            f"best_{kernel}_vs_cublas": best[kernel] and best[kernel].get("vs_cublas"),
                            f"default_{kernel}_vs_cublas": next((r.get("vs_cublas") for r in mine
                                                                 if r["config"] == label), None)})
        key = (str(n) if m == n == k else f"{m}x{n}x{k}") if layout == "nn" else f"{m}x{n}x{k}-{layout}"
        record["sizes" if key.isdigit() else "shapes"][key] = summary
        print_table(key, rows, best)
        del a, b, c
    wrong = [(n, r["kernel"], r["config"]) for n, s in {**record["sizes"], **record["shapes"]}.items()
             for r in s["rows"] if r.get("correct") is False]
    record.update(all_correct=not wrong, topic="matmul", figures=figures(record))
    for n, kernel, config in wrong:
        print(f"WRONG RESULT: {n}, {kernel} {config} differs from the reference by more than {TOLERANCE}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, default=float) + "\n")
    if args.json:
        print(json.dumps(record, default=float))
    return 1 if wrong else 0


def warp_label(cfg, split: int) -> str:
    return cfg.label() + (f" split-K {split}" if split > 1 else "")


def print_table(key: str, rows: list[dict], best: dict) -> None:
    print(f"\n{'M x N x K' if 'x' in key else 'N'} = {key} (float32)")
    print(f"{'kernel':<7} {'configuration':<44} {'ms':>9} {'TFLOP/s':>8} {'cuBLAS':>7} {'peak':>6} "
          f"{'err':>8} {'regs':>4} {'smem':>6} {'lmem':>4} {'blk/SM':>6} limit")
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:<7} {r['config']:<44} failed: {r['error']}")
            continue
        pct = lambda k: f"{100 * r[k]:5.1f}%" if k in r else "     -"  # noqa: E731
        err = f"{r['max_rel_error']:.1e}" if "max_rel_error" in r else "-"
        print(f"{r['kernel']:<7} {r['config']:<44} {1e3 * r['seconds']:9.3f} {r['tflops']:8.2f} "
              f"{pct('vs_cublas'):>7} {pct('vs_peak'):>6} {err:>8} {r.get('regs_per_thread', '-'):>4} "
              f"{r.get('shared_bytes_per_block', '-'):>6} {r.get('local_bytes_per_thread', '-'):>4} "
              f"{r.get('blocks_per_sm', '-'):>6} {r.get('limited_by', '')}")
    for kernel, top in best.items():
        if top:
            print(f"best {kernel} configuration: {top['config']} at {top['tflops']:.2f} TFLOP/s"
                  + (f" = {100 * top['vs_cublas']:.1f}% of cuBLAS" if "vs_cublas" in top else ""))
