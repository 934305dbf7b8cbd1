"""``hpclab scaling PROGRAM``: a strong or weak scaling sweep under mpiexec, CSV and PNG into --out."""
from __future__ import annotations

import json
import sys

from hpclab import programs, scaling
from hpclab.options import Parser, UsageError, count, count_list, output_folder, real


def figures(sweep, program) -> dict:
    """The sweep's medians, speedups, efficiencies and serial fraction as recorded figures (``program``: its
    module, whose ``PROGRAM`` names the unit of work and the topic)."""
    from hpclab.results.recorded import figure

    summary, unit = sweep.summary(), program.PROGRAM.unit
    metrics = (("wall_s", "median_wall_s", "s"), ("speedup", "speedup", "1"), ("efficiency", "efficiency", "1"))
    rows = [figure(sweep.program, sweep.mode, r["ranks"], r["work"], unit, metric, r[key], metric_unit)
            for r in summary for metric, key, metric_unit in metrics]
    if len(summary) > 1:
        top = summary[-1]
        rows.append(figure(sweep.program, sweep.mode, top["ranks"], top["work"], unit, "serial_fraction",
                           sweep.serial_fraction, "1"))
    return {"topic": program.PROGRAM.topic, "figures": rows}


def main(argv: list[str] | None = None) -> int:
    from hpclab.results import plot

    parser = Parser(
        prog="hpclab scaling",
        allow_abbrev=False,  # the program's own options (e.g. --n) must not match ours (--no-progress)
        description="Strong or weak scaling sweep of an hpclab program: one mpiexec per rank count and "
                    "trial, medians, speedup, efficiency, serial fraction; CSV and PNG into --out. "
                    "Options not listed here go to the program (e.g. --samples 1e12 --seed 123).")
    parser.add_argument("program", help="an hpclab run program, e.g. pi-mc")
    parser.add_argument("--ranks", type=count_list(1, 1 << 16), default=(1, 2, 4),
                        help="rank counts, e.g. 1,2,4 (default)")
    parser.add_argument("--weak", action="store_true",
                        help="weak scaling: the work option's value is per rank (multiplied by the ranks)")
    parser.add_argument("--trials", type=count(1, 1000), default=3,
                        help="runs per rank count; the median counts (default 3)")
    parser.add_argument("--mpiexec", default=None,
                        help='launcher command, e.g. "mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH" '
                             "(default: $HPCLAB_MPIEXEC, else the mpiexec beside this Python, else on PATH)")
    parser.add_argument("--work-arg", default=None,
                        help="the program's size option (default: --samples for pi-mc, --bins for pi-midpoint)")
    parser.add_argument("--timing", default="wall_s", help="which timings key to use (default wall_s)")
    parser.add_argument("--timeout", type=real(0, 7 * 86400, lo_open=True), default=600,
                        help="seconds allowed per run, up to a week (default 600)")
    parser.add_argument("--out", default="build/scaling", help="directory for the CSV and PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args, program_argv = parser.parse_known_args(argv)      # a UsageError: the hpclab command says it
    program = programs.load(args.program)
    out = output_folder(args.out, "--out", "hpclab scaling")     # before hours of runs, not after
    try:
        sweep = scaling.sweep_mpiexec(program, program_argv, sorted(set(args.ranks)), args.weak, args.trials,
                                      args.mpiexec, args.work_arg, args.timing, args.timeout,
                                      progress=not args.no_progress)
    except UsageError:
        raise
    except (ValueError, RuntimeError) as exc:
        print(f"hpclab scaling: error: {exc}", file=sys.stderr)
        return 1
    stem = f"{args.program}_{sweep.mode}"
    csv_path = sweep.write_csv(out / f"{stem}.csv")
    png_path = plot.save(sweep.figure(), stem, directory=out)
    (out / f"{stem}.json").write_text(json.dumps(figures(sweep, program)) + "\n")
    print(sweep.table())
    print(f"wrote {csv_path}, {png_path} and {stem}.json (its figures, for benchmarks/record.py)")
    return 0 if all(r["passed"] for r in sweep.records) else 1
