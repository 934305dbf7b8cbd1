"""Workshop Exercise 1: pi = integral of 4/(1+x^2) over [0, 1] by the midpoint rule, on every rank's GPU."""
from __future__ import annotations

import math

from hpclab import backend
from hpclab.errors import step
from hpclab.options import count
from hpclab.runner import Program, Report
from hpclab.pi.check import MAX_BINS, midpoint_bound, truncation_bound
from hpclab.pi.program import Work, add_launch_arguments, error_rows, my_share, rank_line, rate_line, summed
from hpclab.mpi import MPI

PROGRAM = Program("pi-midpoint", "pi", "--bins", "bins")
BINS = Work("bins", gpu=10**11, sim=10_000)
validate = BINS.check     # the input check of `hpclab run` (runner.checked)
HELP = ("Workshop Exercise 1: pi by the midpoint rule in float64; each rank integrates a "
        "contiguous slice of the bins on its GPU, then an MPI reduction adds the slices.")


def add_arguments(parser) -> None:
    parser.add_argument("--bins", type=count(1, MAX_BINS), default=None,
                        help="number of bins (e.g. 1e11; default 1e11 on a GPU, 10000 on the simulator)")
    add_launch_arguments(parser)


def run(args, ctx) -> Report:
    from hpclab.pi import fast    # loads numba.cuda: not needed to reject bad arguments

    comm, size, rank = ctx.comm, ctx.comm.size, ctx.comm.rank
    bins = BINS.of(args)
    start, stop, blocks, threads = my_share(comm, bins, args)
    with step(comm, "kernel compilation (warm-up)"):
        fast.partial_sum(0, 1, 1, 1, threads)
    partial, total, local, wall_s, compute_max = summed(
        comm, "midpoint kernel", lambda: fast.partial_sum(start, stop, bins, blocks, threads))
    # Rank blocks may differ (few bins): the bound uses the largest launch.
    bound = midpoint_bound(bins, comm.allreduce(blocks, op=MPI().MAX), threads, size)
    err = abs(total - math.pi)
    report = Report(
        rank_line=rank_line(ctx.placement, "bins", stop - start, blocks, threads, f"partial pi = {partial:.15f}",
                            local),
        passed=err <= bound,
        timings={"wall_s": wall_s, "compute_s": compute_max, "bins_per_s": bins / wall_s},
    )
    if rank == 0:
        report.final = [
            *error_rows("Computed PI", total, 15),
            ("Error bound", f"{bound:.3e} (h^2/3 = {truncation_bound(bins):.3e} + float64 rounding)"),
            ("Total bins", f"{bins}"),
            ("Wall time", f"{wall_s:.6f} s"),
            ("Bins/s", rate_line(bins, wall_s, ctx.placement)),
        ]
        if err > bound:
            report.notes.append(f"the error {err:.3e} exceeds the bound {bound:.3e}: the kernel or the "
                                "decomposition loses or repeats bins")
        if backend.name() == "gpu" and wall_s < 1e-3:
            report.notes.append(f"{bins} bins take {wall_s * 1e6:.0f} us: this times kernel launch and "
                                "MPI latency, not arithmetic; use --bins 1e11 or more to measure throughput")
        report.result = {"pi": total, "abs_error": err, "rel_error": err / math.pi, "bins": bins,
                         "error_bound": bound, "h": 1.0 / bins, "truncation_bound": truncation_bound(bins)}
    return report
