"""Workshop Exercise 2: pi by Monte Carlo, samples split among ranks, hits added with MPI."""
from __future__ import annotations

import math

from hpclab.errors import step
from hpclab.runner import Program, Report
from hpclab.timing import wall
from hpclab.pi.check import estimate
from hpclab.pi.program import (Work, add_launch_arguments, add_sample_arguments, error_rows, my_share,
                               rank_line, rate_line, summed)

PROGRAM = Program("pi-mc", "pi", "--samples", "samples")
SAMPLES = Work("samples", gpu=10**11, sim=20_000)
validate = SAMPLES.check     # the input check of `hpclab run` (runner.checked)
HELP = ("Workshop Exercise 2: pi by Monte Carlo; each rank counts hits for its share of the "
        "samples on its GPU. The default counter-based generator makes the estimate depend only "
        "on (samples, seed), whatever the number of ranks.")

GENERATORS = {"counter": "counter-based Philox4x32-7, seed {} (same estimate on any number of ranks)",
              "xoroshiro": "xoroshiro128+ (numba.cuda.random), seed {}, one subsequence per thread and rank"}


def add_arguments(parser) -> None:
    add_sample_arguments(parser, 123, "number of samples (e.g. 1e12; default 1e11 on a GPU, 20000 on the simulator)")
    parser.add_argument("--generator", choices=tuple(GENERATORS), default="counter",
                        help="counter: Philox4x32-7 of the global sample index, identical on any number "
                             "of ranks (default); xoroshiro: numba.cuda.random per-thread streams, "
                             "which depend on the ranks and the launch shape")
    add_launch_arguments(parser)


def run(args, ctx) -> Report:
    comm, rank = ctx.comm, ctx.comm.rank
    samples, seed = SAMPLES.of(args), args.seed
    start, stop, blocks, threads = my_share(comm, samples, args)
    timings = {}
    if args.generator == "counter":
        from hpclab.pi import fast

        with step(comm, "kernel compilation (warm-up)"):
            fast.count_hits(0, 2, seed, 1, threads)                      # one Philox call: compiles
        work = lambda: fast.count_hits(start, stop - start, seed, blocks, threads)  # noqa: E731
    else:
        from hpclab.pi import xoroshiro

        with step(comm, "xoroshiro128+ states"):
            xoroshiro.count_hits(threads, seed, rank, 1, threads)       # compiles the kernel
            states, init_s, init_max = wall(lambda: xoroshiro.states(blocks * threads, seed, rank), comm)
        timings["state_init_s"] = init_max
        work = lambda: xoroshiro.count_hits(stop - start, seed, rank, blocks, threads, states)  # noqa: E731

    hits, total_hits, local, wall_s, compute_max = summed(comm, "Monte Carlo kernel", work)
    e = estimate(total_hits, samples)
    pi_hat, err, sigma = e["pi"], e["abs_error"], e["sigma"]
    timings.update({"wall_s": wall_s, "compute_s": compute_max, "samples_per_s": samples / wall_s})
    report = Report(
        rank_line=rank_line(ctx.placement, "samples", stop - start, blocks, threads, f"hits = {hits}", local),
        passed=err <= 5 * sigma,
        timings=timings,
    )
    if rank == 0:
        report.final = [
            *error_rows("Estimated PI", pi_hat, 10),
            ("Standard error", f"{sigma:.3e} (error = {err / sigma:.2f} sigma; passes within 5 sigma)"),
            ("Total hits", f"{total_hits}"),
            ("Total samples", f"{samples}"),
            ("Generator", GENERATORS[args.generator].format(seed)),
            ("Wall time", f"{wall_s:.6f} s"),
            ("Samples/s", rate_line(samples, wall_s, ctx.placement)),
        ]
        if "state_init_s" in timings:
            report.final.append(("State init", f"{timings['state_init_s']:.6f} s (host side, not in wall time)"))
        if err > 5 * sigma:
            report.notes.append(f"the estimate is {err / sigma:.1f} standard errors from pi (allowed: 5): "
                                "samples are lost, repeated or correlated")
        report.result = {"pi": pi_hat, "abs_error": err, "rel_error": err / math.pi, "hits": total_hits,
                         "samples": samples, "seed": seed, "generator": args.generator,
                         "standard_error": sigma}
    return report
