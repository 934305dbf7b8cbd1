"""AlexNet layers split by height across ranks, halos exchanged, in five versions."""
from __future__ import annotations

import sys
import time

import numpy as np

from hpclab import backend, budget, comm as hcomm
from hpclab.halo import alexnet
from hpclab.halo.conv import METHODS
from hpclab.halo.geometry import min_input_height, plan_bands
from hpclab.halo.layers import Conv, check_chain, shapes
from hpclab.halo.versions import TWIN, VERSIONS, digest, max_rel_error, run_version, with_twins
from hpclab.options import choice_list, count, seed
from hpclab.runner import Program, Report

PROGRAM = Program("conv-halo", "conv")
HELP = ("Convolution with halo exchange: an AlexNet block (or the whole trunk) split by output rows "
        "across ranks, in five versions (serial, MPI CPUs, one GPU, MPI+GPU host-staged, GPU-to-GPU), "
        "each checked against the serial result.")

TOLERANCE = 1e-4          # max error relative to max |V1| (float32 sums in a different order)
SIM_SCALE = 32            # channels / 32 on the simulator
# (height, width) of the input of each block at AlexNet's size, and on the simulator (a few output rows per rank).
FULL_INPUT = {"c1": (227, 227), "c2": (27, 27), "c3": (13, 13), "c4": (13, 13), "c5": (13, 13), "trunk": (227, 227)}
SIM_INPUT = {"c1": (35, 19), "c2": (11, 7), "c3": (7, 5), "c4": (7, 5), "c5": (7, 5), "trunk": (67, 67)}
MAX_SIDE = (1 << 31) - 1


def add_arguments(parser) -> None:
    parser.add_argument("--layer", default="c2", choices=alexnet.LAYERS,
                        help="c1 (conv+pool), c2 (conv+pool+LRN), c3, c4, c5 (conv+pool) or the whole trunk")
    height = parser.add_mutually_exclusive_group()
    height.add_argument("--height", type=count(1, MAX_SIDE), default=None, help="input height (rows) of the block")
    height.add_argument("--rows-per-rank", type=count(1, MAX_SIDE), default=None,
                        help="weak scaling: choose the height so each rank owns this many output rows "
                             "of the block's convolution (instead of --height)")
    parser.add_argument("--width", type=count(1, MAX_SIDE), default=None, help="input width of the block")
    parser.add_argument("--batch", type=count(1, 1 << 20), default=1, help="images per batch (default 1)")
    parser.add_argument("--version", type=choice_list(VERSIONS, alone=("all",), noun="version"), default=("all",),
                        help="all, or a comma list of v1..v5 (V1 and the serial twin always run as the check)")
    parser.add_argument("--comm", default="auto", choices=hcomm.BACKENDS,
                        help="backend for V5's GPU-to-GPU halos: auto, nccl, mpi-cuda or mpi-host")
    parser.add_argument("--scale", type=count(1, 1024), default=None,
                        help="divide channel counts by this (default 1 on a GPU, 32 on the simulator)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="exchange halos first, then compute every row (no overlap)")
    parser.add_argument("--repeats", type=count(1, 1000), default=None,
                        help="timed runs per version, median reported (default 3 on a GPU, 1 on the simulator)")
    parser.add_argument("--method", default="auto", choices=("auto", *METHODS),
                        help="GPU convolution: the plain kernel (naive), im2col + GEMM or Winograd (auto: on a "
                             "GPU Winograd where the layer allows it, else gemm; naive on the simulator)")
    parser.add_argument("--progress", action="store_true",
                        help="rank 0 prints a line to stderr as each version starts and ends")
    parser.add_argument("--seed", type=seed(), default=2012)


def validate(args, launch) -> None:
    """The block fits the ranks (a row of every layer's output per rank), the memory and the day."""
    versions = with_twins(args.version)
    ops, shape, _ = _setup(args, launch.ranks)
    n, c, h, w = shape
    name = next(name for name in ("rows_per_rank", "height", "width", "batch") if getattr(args, name))
    option, value = "--" + name.replace("_", "-"), getattr(args, name)
    check_chain(ops, (c, h, w), launch.ranks, what="in the trunk, " if args.layer == "trunk" else "")
    table = alexnet.layer_table(ops, (c, h, w), n)
    nbytes = sum(row["bytes"] for row in table)          # every layer's input, output and weights
    budget.refuse_large(option, value, launch.node_bytes(2 * nbytes, 2 * nbytes / launch.ranks),
                        f"the {args.layer} block on a {n}x{c}x{h}x{w} input, whole on rank 0 for the check",
                        available=launch.memory)
    flops = sum(row["flops"] for row in table) * len(versions) * (args.repeats or 1)
    rate = launch.fastest("flops")
    budget.refuse_long(option, value, flops / (rate * launch.ranks),
                       f"{flops:.3g} floating-point operations over {len(versions)} versions at under "
                       f"{rate:.0e} per second per rank")


def _setup(args, size):
    scale = args.scale or backend.auto_size(1, SIM_SCALE)
    trunk = args.layer == "trunk"
    c = alexnet.input_channels("c1" if trunk else args.layer, scale)
    ops = alexnet.trunk_ops(scale, args.seed) if trunk else alexnet.conv_ops(args.layer, c, scale, args.seed)
    h, w = backend.auto_size(FULL_INPUT[args.layer], SIM_INPUT[args.layer])
    if args.rows_per_rank:
        h = min_input_height(args.rows_per_rank * size, *ops[0].window)
    h, w = args.height or h, args.width or w
    for op in ops:
        if isinstance(op, Conv):
            op.method = None if args.method == "auto" else args.method
    return ops, (args.batch, c, h, w), scale


def _rank_line(placement, ops, shape, size, rank) -> str:
    first = ops[0]
    kernel, stride, pad = first.window
    p = plan_bands(shape[2], kernel, stride, pad, size, first.tile)[rank]
    src = lambda segs: ",".join(str(s.src) for s in segs) or "-"  # noqa: E731
    return (f"{placement.label()} | {first.name}: output rows [{p.out_rows[0]}, {p.out_rows[1]}) of "
            f"{p.out_height} | input rows [{p.have[0]}, {p.have[1]}) own [{p.own[0]}, {p.own[1]}) | "
            f"halo {p.halo_above} above (rank {src(p.above)}), {p.halo_below} below (rank {src(p.below)}) "
            f"| interior [{p.interior[0]}, {p.interior[1]})")


def run(args, ctx) -> Report:
    comm, size, rank = ctx.comm, ctx.comm.size, ctx.comm.rank
    sim = backend.is_simulator()
    with hcomm.step(comm, "input check"):
        versions = with_twins(args.version)
        ops, shape, scale = _setup(args, size)
        n, c, h, w = shape
        out_shapes = shapes(ops, (c, h, w))          # (validate has checked the chain)
        dense = alexnet.dense_ops(int(np.prod(out_shapes[-1])), scale, args.seed) if args.layer == "trunk" else []
    repeats = args.repeats or (1 if sim else 3)
    outcomes = {}
    start = time.perf_counter()

    def progress(text):
        if args.progress and rank == 0:
            print(f"[conv-halo {time.perf_counter() - start:7.1f} s] {text}", file=sys.stderr, flush=True)

    for v in versions:
        progress(f"{v.upper()} {VERSIONS[v]}: start")
        with hcomm.step(comm, f"version {v.upper()}"):
            outcomes[v] = run_version(v, ops, dense, shape, args.seed, comm, args.comm,
                                      not args.no_overlap, repeats,
                                      warmup=0 if sim or v in ("v1", "v2") else 1)  # compile first
        progress(f"{v.upper()} done, {outcomes[v].wall_s:.4f} s per run")

    methods = {op.name: op.runs for op in ops if isinstance(op, Conv)}
    # The version whose time is reported as wall_s: the last one asked for.
    primary = "v5" if args.version == ("all",) else args.version[-1]
    p = outcomes[primary]
    report = Report(rank_line=_rank_line(ctx.placement, ops, shape, size, rank),
                    timings={"wall_s": p.wall_s, "version": primary, **{f"{k}_s": x for k, x in p.phases.items()},
                             **{f"{v}_wall_s": o.wall_s for v, o in outcomes.items()}})
    checks = {}
    if rank == 0:
        out_shape = [n, *out_shapes[-1]] if not dense else [n, dense[-1].w.shape[0]]
        report.final = [
            ("Layer", f"{args.layer}: " + ", ".join(op.describe() for op in ops)
             + (f", then {', '.join(d.name for d in dense)} on rank 0" if dense else "")),
            ("Input", f"{'x'.join(map(str, shape))} (N x C x H x W), output {'x'.join(map(str, out_shape))}"),
            ("Decomposition", f"{size} rank(s), output rows of every pooling/convolution split by height"),
        ]
        report.notes = [o.note for o in outcomes.values() if o.note]
        if sim:
            report.notes.append(f"simulator: reduced sizes (channels / {scale}, input {h}x{w}); "
                                "AlexNet's full sizes run on a GPU")
        digests = {v: digest(o.out) for v, o in outcomes.items()}
        for v, o in outcomes.items():
            err = max_rel_error(o.out, outcomes["v1"].out)
            same = digests[v] == digests[TWIN[v]]
            checks[v] = {"digest": digests[v], "digest_matches_twin": same, "twin": TWIN[v],
                         "digest_matches_v1": digests[v] == digests["v1"], "max_rel_error": err,
                         "ok": bool(same and err <= TOLERANCE), "wall_s": o.wall_s,
                         "phases": {k: round(x, 6) for k, x in o.phases.items()}, "comm": o.comm,
                         "note": o.note}
            via = f" via {o.comm}" if o.comm else ""
            report.final.append((f"{v.upper()} {VERSIONS[v]}", f"{o.wall_s:.4f} s{via} | digest {digests[v]} "
                                 f"({'=' if same else '!='} {TWIN[v].upper()}) | max rel. error vs V1 {err:.1e}"))
            if not checks[v]["ok"]:
                report.notes.append(f"{v.upper()} differs: digest {'matches' if same else 'differs from'} "
                                    f"{TWIN[v].upper()}, max rel. error {err:.2e} (tolerance {TOLERANCE:g})")
        split = ", ".join(f"{k} {x:.4f} s" for k, x in p.phases.items())
        how = "" if sim or primary in ("v1", "v2") else " (separate pass: no overlap, GPU synchronised per phase)"
        report.final.append((f"Time split {primary.upper()}{how}", split))
        report.final.append(("GPU convolution", ", ".join(f"{name} {m}" for name, m in methods.items())
                             + "".join(f"; {m}: {METHODS[m]}" for m in dict.fromkeys(methods.values()))))
        report.result = {"layer": args.layer, "input": list(shape), "output": out_shape, "scale": scale,
                         "method": args.method, "methods": methods, "simulator_reduced": sim,
                         "overlap": not args.no_overlap,
                         "versions": checks, "table": alexnet.layer_table(ops, (c, h, w), n, size, dense),
                         "tolerance": TOLERANCE}
    report.passed = bool(comm.bcast(all(ch["ok"] for ch in checks.values()) if rank == 0 else None, root=0))
    return report
