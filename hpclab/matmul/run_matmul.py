"""Distributed matrix multiply C = A @ B over MPI ranks, one GPU each.

Rank 0 makes A and B (N x N). A's rows are scattered (the first N % P ranks take one row more), B is broadcast whole,
every rank multiplies its rows on its GPU, and the blocks of C are gathered to rank 0, which checks C against NumPy.
Communication is O(N^2) per rank, compute O(N^3 / P): the bigger N, the better this scales.
"""
from __future__ import annotations

import numpy as np

from hpclab import backend, budget, comm as hcomm
from hpclab.matmul import fast as mm
from hpclab.matmul.check import tolerance
from hpclab.options import count, seed
from hpclab.runner import Program, Report
from hpclab.timing import Phases, wall

PROGRAM = Program("matmul", "matmul", unit="N")
HELP = ("Distributed GEMM: rows of A scattered (uneven splits allowed), B broadcast, C = A @ B "
        "on every rank's GPU, gathered and checked against NumPy on rank 0.")


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=count(1, (1 << 31) - 1), default=None,
                        help="matrix size N (default 4096 on a GPU, 24 on the simulator)")
    parser.add_argument("--kernel", choices=mm.KERNELS, default="fast")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=seed(), default=0)
    parser.add_argument("--repeats", type=count(1, 10**6), default=1,
                        help="times the whole scatter-multiply-gather is run (the fastest is reported)")


def default_n() -> int:
    return backend.auto_size(gpu=4096, sim=24)


def validate(args, launch) -> None:
    n = args.n or default_n()
    budget.require_share("--n", n, launch.ranks, "rows")
    item = np.dtype(args.dtype).itemsize
    mine = 2 * -(-n // launch.ranks) * n * item               # this rank's rows of A and C
    first = (3 * item + 8) * n * n + mine                      # A, B, C, and B in float64 for the check
    budget.refuse_large("--n", n, launch.node_bytes(first, item * n * n + mine),
                        f"A, B and C ({n}x{n} {args.dtype}) on rank 0 and B on every rank",
                        available=launch.memory)
    flops, rate = 2 * n ** 3 * args.repeats, launch.fastest("flops")
    budget.refuse_long("--n", n, flops / (rate * launch.ranks),
                       f"{flops:.3g} floating-point operations at under {rate:.0e} per second per rank")


def distributed_matmul(a, b, n: int, dtype, kernel: str, comm, phases: Phases):
    """One scatter-multiply-gather; a and b are only read on rank 0. Returns C on rank 0."""
    rank, size = comm.rank, comm.size
    rows = hcomm.block_counts(n, size)
    counts = [r * n for r in rows]                       # elements per rank
    displs = [sum(counts[:r]) for r in range(size)]
    a_mine = np.empty((rows[rank], n), dtype=dtype)
    b_all = b if rank == 0 else np.empty((n, n), dtype=dtype)
    with phases("comm"):
        comm.Scatterv([a, counts, displs, None] if rank == 0 else None, a_mine, root=0)
        comm.Bcast(b_all, root=0)
    with phases("transfer"):
        d_a = mm.cuda.to_device(a_mine)
        d_b = mm.cuda.to_device(b_all)
    with phases("compute"):
        d_c = mm.matmul(d_a, d_b, kernel)
    with phases("transfer"):
        c_mine = d_c.copy_to_host()
    c = np.empty((n, n), dtype=dtype) if rank == 0 else None
    with phases("comm"):
        comm.Gatherv(c_mine, [c, counts, displs, None] if rank == 0 else None, root=0)
    return c


def run(args, ctx) -> Report:
    comm, size, rank = ctx.comm, ctx.comm.size, ctx.comm.rank
    n = args.n or default_n()
    dtype = np.dtype(args.dtype)
    with hcomm.step(comm, f"compiling the {args.kernel} kernel"):
        x = mm.cuda.to_device(np.ones((2, 2), dtype=dtype))
        mm.matmul(x, x, args.kernel)
        mm.cuda.synchronize()

    a = b = None
    if rank == 0:
        rng = np.random.default_rng(args.seed)
        a, b = (rng.uniform(-1, 1, (n, n)).astype(dtype) for _ in range(2))

    runs = []
    for _ in range(args.repeats):
        phases = Phases()
        with hcomm.step(comm, f"distributed matmul ({args.kernel} kernel)"):
            c, _, wall_s = wall(lambda: distributed_matmul(a, b, n, dtype, args.kernel, comm, phases), comm)
        runs.append((wall_s, phases.max_over_ranks(comm)))     # a collective: every rank, every time
    best, best_phases = min(runs, key=lambda r: r[0])

    my_rows = hcomm.block_range(n, size, rank)
    report = Report(
        rank_line=f"{ctx.placement.label()} | rows {my_rows[0]}..{my_rows[1] - 1} of A and C "
                  f"({my_rows[1] - my_rows[0]} x {n}) | {args.kernel} kernel",
        timings={"wall_s": best, **{f"{k}_s": v for k, v in best_phases.items()}},
    )
    if rank == 0:
        summarise(report, a, b, c, n, dtype, args, size, best, best_phases)
    report.passed = comm.bcast(report.passed, root=0)     # the exit status is the same on every rank
    return report


FULL_CHECK_N = 2048      # above this, the float64 reference of every row costs minutes on a CPU
SAMPLED_ROWS = 256


def check_rows(n: int, size: int, seed: int) -> np.ndarray:
    """Rows of C to check: all of them for small N; else every rank's first and last
    row (where a wrong split shows) and random others."""
    if n <= FULL_CHECK_N:
        return np.arange(n)
    bands = [hcomm.block_range(n, size, r) for r in range(size)]
    edges = {i for start, stop in bands for i in (start, stop - 1)}
    rng = np.random.default_rng(seed + 1)
    return np.array(sorted(edges | set(rng.choice(n, SAMPLED_ROWS, replace=False).tolist())))


def summarise(report, a, b, c, n, dtype, args, size, best, best_phases) -> None:
    """Rank 0: check the answer against NumPy and fill in the FINAL RESULTS."""
    rows = check_rows(n, size, args.seed)
    reference = a[rows].astype(np.float64) @ b.astype(np.float64)
    scale = float(np.abs(reference).max()) or 1.0
    err = float(np.abs(c[rows] - reference).max()) / scale
    tol = tolerance(dtype, n)
    report.passed = bool(err <= tol)
    checked = "every row" if rows.size == n else f"{rows.size} rows (every rank's first and last, and random ones)"
    gflops = mm.flops(n, n, n) / best / 1e9
    report.final = [
        ("Matrix size", f"{n}x{n} {dtype.name}, {args.kernel} kernel"),
        ("Ranks", f"{size} (rows per rank {', '.join(map(str, hcomm.block_counts(n, size)))})"),
        ("Max error", f"{err:.2e} of max|C| (tolerance {tol:.1e}) against NumPy float64, {checked}"),
        ("Wall time", f"{best:.6f} s (max over ranks, best of {args.repeats}): "
                      + ", ".join(f"{k} {v:.6f} s" for k, v in best_phases.items())),
        ("Rate", f"{gflops:.2f} GFLOP/s end to end (2 N^3 / wall time)"),
    ]
    if not report.passed:
        k, j = np.unravel_index(int(np.argmax(np.abs(c[rows] - reference))), reference.shape)
        i = int(rows[k])
        owner = next(r for r in range(size) if i < hcomm.block_range(n, size, r)[1])
        report.notes.append(f"C[{i}, {j}] = {c[i, j]!r} but NumPy gives {reference[k, j]!r} "
                            f"(row {i} was computed by rank {owner})")
    report.result = {"n": n, "ranks": size, "kernel": args.kernel, "dtype": dtype.name,
                     "rows_per_rank": hcomm.block_counts(n, size), "max_rel_error": err,
                     "tolerance": tol, "gflops": gflops,
                     # the same for any rank count: each element is summed in the same order
                     "c_checksum": float(c.sum(dtype=np.float64))}
