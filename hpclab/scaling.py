"""Strong and weak scaling sweeps of any ``hpclab run`` program, over rank counts.

Two routes, one record format:

- ``sweep_mpiexec``: one ``mpiexec -n N python -m hpclab run PROGRAM ... --json``
  per rank count and trial (the ``hpclab scaling`` command); reads the JSON line.
- ``sweep_engines``: on connected ipyparallel MPI engines (a notebook), the
  engines' COMM_WORLD is split into sub-communicators of sizes 1..n and the
  program's ``run(args, ctx)`` runs on each, with ``ctx.comm`` the sub-communicator.

A program takes part by reporting ``timings["wall_s"]`` (barrier-synchronised,
max over ranks); the work size is the value of its size option (``--samples``
for pi-mc, ``--bins`` for pi-midpoint, ``--work-arg`` for others), which a
weak sweep multiplies by the rank count.

Strong scaling: speedup S(n) = T(1)/T(n), efficiency E(n) = S(n)/n, and the
Amdahl serial fraction f from S(n) = 1 / (f + (1 - f)/n). Weak scaling:
efficiency E(n) = T(1)/T(n), scaled speedup n E(n), and the Gustafson serial
fraction f from n E(n) = n - f (n - 1).

Every record carries ``ranks_per_gpu`` (the most ranks on one device) and
``shared_gpu``: where ranks share a GPU, more ranks do not bring more GPU, so
such a sweep measures time sharing, not scaling, and its figure says so.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

WORK_ARGS = {"pi-mc": "--samples", "pi-midpoint": "--bins"}
CSV_FIELDS = ["program", "mode", "ranks", "trial", "work", "wall_s", "passed", "median_wall_s",
              "speedup", "efficiency", "serial_fraction", "backend", "ranks_per_gpu", "shared_gpu"]


# ---------------------------------------------------------------- the analysis

def serial_fraction(ranks: list[int], speedups: list[float], mode: str = "strong") -> float:
    """Least-squares serial fraction, clipped to [0, 1] (nan with fewer than two rank counts).

    Strong (Amdahl): 1/S - 1/n = f (1 - 1/n).  Weak (Gustafson): n - S = f (n - 1).
    Both are linear in f through the origin: f = sum(a b) / sum(a a).
    """
    pairs = [(n, s) for n, s in zip(ranks, speedups) if n > 1 and s > 0]
    if not pairs:
        return float("nan")
    if mode == "strong":
        a = [1 - 1 / n for n, _ in pairs]
        b = [1 / s - 1 / n for n, s in pairs]
    else:
        a = [n - 1 for n, _ in pairs]
        b = [n - s for n, s in pairs]
    f = sum(x * y for x, y in zip(a, b)) / sum(x * x for x in a)
    return min(1.0, max(0.0, f))


def amdahl_speedup(n: float, f: float) -> float:
    return 1.0 / (f + (1.0 - f) / n)


@dataclass
class Sweep:
    """Every trial of a sweep, and what follows from their medians."""

    program: str
    mode: str                                   # "strong" or "weak"
    records: list[dict] = field(default_factory=list)   # ranks, trial, work, wall_s, passed, backend,
    #                                                     ranks_per_gpu, shared_gpu

    @property
    def shared_gpu(self) -> bool:
        """Whether any run had ranks sharing a GPU (then it measured time sharing, not scaling)."""
        return any(r.get("shared_gpu") for r in self.records)

    def sharing_note(self) -> str:
        """One line for a figure or table: empty when every rank had a GPU of its own."""
        if not self.shared_gpu:
            return ""
        most = max(r.get("ranks_per_gpu") or 1 for r in self.records)
        return f"up to {most} ranks shared one GPU: this measures time sharing, not scaling"

    def summary(self) -> list[dict]:
        """One row per rank count: median wall time, speedup, efficiency."""
        ranks = sorted({r["ranks"] for r in self.records})
        med = {n: statistics.median(r["wall_s"] for r in self.records if r["ranks"] == n) for n in ranks}
        base_n = ranks[0]
        base = med[base_n] * base_n if self.mode == "strong" else med[base_n]
        rows = []
        for n in ranks:
            trials = [r for r in self.records if r["ranks"] == n]
            if self.mode == "strong":
                speedup = base / med[n]             # relative to the smallest count, scaled to 1 rank
                efficiency = speedup / n
            else:
                efficiency = base / med[n]
                speedup = n * efficiency
            rows.append({"ranks": n, "work": trials[0]["work"], "median_wall_s": med[n], "speedup": speedup,
                         "efficiency": efficiency, "trials": len(trials),
                         "passed": all(r["passed"] for r in trials)})
        return rows

    @property
    def serial_fraction(self) -> float:
        rows = self.summary()
        return serial_fraction([r["ranks"] for r in rows], [r["speedup"] for r in rows], self.mode)

    def rows(self) -> list[dict]:
        """The CSV rows: each trial, with its rank count's summary beside it."""
        by_n = {r["ranks"]: r for r in self.summary()}
        f = self.serial_fraction
        return [{"program": self.program, "mode": self.mode, **{k: rec.get(k) for k in
                 ("ranks", "trial", "work", "wall_s", "passed", "backend", "ranks_per_gpu", "shared_gpu")},
                 "median_wall_s": by_n[rec["ranks"]]["median_wall_s"], "speedup": by_n[rec["ranks"]]["speedup"],
                 "efficiency": by_n[rec["ranks"]]["efficiency"], "serial_fraction": f}
                for rec in sorted(self.records, key=lambda r: (r["ranks"], r["trial"]))]

    def write_csv(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(self.rows())
        return path

    def figure(self, title: str | None = None):
        from hpclab import plot

        title = title or f"{self.program}: {self.mode} scaling"
        if self.shared_gpu:
            title += f"\n({self.sharing_note()})"
        return plot.scaling_figure(self.summary(), mode=self.mode, serial_fraction=self.serial_fraction,
                                   title=title)

    def table(self) -> str:
        lines = [f"{'ranks':>5}  {'work':>16}  {'median wall (s)':>15}  {'speedup':>8}  {'efficiency':>10}  trials  check"]
        for r in self.summary():
            lines.append(f"{r['ranks']:>5}  {r['work'] if r['work'] is not None else '-':>16}  "
                         f"{r['median_wall_s']:>15.6f}  {r['speedup']:>8.3f}  {r['efficiency']:>10.3f}  "
                         f"{r['trials']:>6}  {'PASSED' if r['passed'] else 'FAILED'}")
        law = "Amdahl" if self.mode == "strong" else "Gustafson"
        lines.append(f"serial fraction ({law} fit): {self.serial_fraction:.4f}")
        if self.shared_gpu:
            lines.append(f"note: {self.sharing_note()}")
        return "\n".join(lines)


# ---------------------------------------------------------------- program arguments

def work_arg_for(program: str, work_arg: str | None = None) -> str | None:
    return work_arg or WORK_ARGS.get(program)


def _find_value(argv: list[str], option: str) -> tuple[int, str] | None:
    """(index, text) of option's value in argv, for ``--opt V`` and ``--opt=V``."""
    for i, a in enumerate(argv):
        if a == option and i + 1 < len(argv):
            return i + 1, argv[i + 1]
        if a.startswith(option + "="):
            return i, a.split("=", 1)[1]
    return None


def scaled_args(argv: list[str], option: str | None, factor: int) -> tuple[list[str], int | None]:
    """argv with option's count multiplied by factor, and the new count (None if absent)."""
    from hpclab.options import UsageError, count

    found = _find_value(argv, option) if option else None
    if not found:
        return list(argv), None
    i, text = found
    try:
        value = count(1, None)(text) * factor
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"hpclab scaling: error: argument {option}: {exc}") from None
    out = list(argv)
    out[i] = str(value) if out[i] == text else f"{option}={value}"
    return out, value


def _work_plan(program, argv, ranks, weak, work_arg):
    from hpclab.options import UsageError

    option = work_arg_for(program, work_arg)
    if weak and not (option and _find_value(argv, option)):
        raise UsageError(f"hpclab scaling: error: a weak sweep scales the work with the ranks: give the "
                         f"per-rank work, e.g. {option or '--work-arg --size'} N (for pi-mc: --samples 1e9)")
    return {n: scaled_args(argv, option, n if weak else 1) for n in ranks}


def check_plan(program: str, plan: dict) -> None:
    """Every run of the sweep parses and passes the program's own check, before the first starts.

    The runs may land elsewhere (``--mpiexec srun`` from a login node), so this check is the
    lenient one: GPU speed and no memory limit; each run checks again where it runs. Where
    this node cannot even choose a backend (HPCLAB_BACKEND=gpu on a login node), only the
    options' types and ranges are checked here.
    """
    import math

    from hpclab import backend, runner
    from hpclab.budget import Launch

    try:
        backend.select()
        lenient = True
    except backend.BackendError:
        lenient = False
    for n, (argv, _) in plan.items():
        runner.parse_arguments(program, argv, Launch(n, 1, "gpu", math.inf) if lenient else None)


def program_args(program: str, argv: list[str]):
    """The argparse namespace ``hpclab run PROGRAM ARGV`` would give (for the engines route)."""
    from hpclab import runner

    return runner.parse_arguments(program, argv)[1]


# ---------------------------------------------------------------- route 1: mpiexec

def default_mpiexec() -> list[str]:
    from hpclab.options import UsageError

    """``$HPCLAB_MPIEXEC`` (a whole command line), else the mpiexec beside this Python, else on PATH."""
    if os.environ.get("HPCLAB_MPIEXEC", "").strip():
        return shlex.split(os.environ["HPCLAB_MPIEXEC"])
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise UsageError("hpclab scaling: error: no mpiexec beside this Python or on PATH: install MPI "
                         "(pip install 'hpclab[mpi]', or module load openmpi) or name the launcher with "
                         "--mpiexec")
    return [found]


def launcher(text: str | list[str] | None) -> list[str]:
    """The launcher command from --mpiexec (default: mpiexec beside this Python, else on PATH);
    its program must exist."""
    from hpclab.options import UsageError

    if text is None:
        return default_mpiexec()
    try:
        cmd = shlex.split(text) if isinstance(text, str) else list(text)
    except ValueError as exc:
        raise UsageError(f"hpclab scaling: error: --mpiexec {text!r}: {exc}") from None
    if not cmd or not (shutil.which(cmd[0]) or Path(cmd[0]).is_file()):
        raise UsageError(f"hpclab scaling: error: --mpiexec {text!r}: no program "
                         f"{cmd[0] if cmd else ''!r} found (not a file, not on PATH); give the launcher "
                         "of your MPI, e.g. --mpiexec mpirun")
    return cmd


def run_once(program: str, argv: list[str], ranks: int, mpiexec: list[str] | None = None,
             timeout: float = 600) -> dict:
    """One ``mpiexec -n ranks python -m hpclab run program argv --json``; its JSON record."""
    cmd = [*(mpiexec or default_mpiexec()), "-n", str(ranks), sys.executable, "-m", "hpclab", "run",
           program, *argv, "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{shlex.join(cmd)} ran longer than {timeout:g} s; use a smaller size "
                           "or a larger --timeout") from None
    except OSError as exc:
        raise RuntimeError(f"cannot start {shlex.join(cmd)}: {exc.strerror or exc}") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("error"):
                raise RuntimeError(f"{program} on {ranks} rank(s) failed: {record['error']}")
            return record
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
    raise RuntimeError(f"{shlex.join(cmd)} exited with {proc.returncode} and no JSON line:\n{tail}")


def sweep_mpiexec(program: str, argv: list[str], ranks: list[int], weak: bool = False, trials: int = 3,
                  mpiexec: list[str] | str | None = None, work_arg: str | None = None,
                  timing: str = "wall_s", timeout: float = 600, progress: bool = True) -> Sweep:
    """Run the program under mpiexec for each rank count, ``trials`` times each."""
    from tqdm.auto import tqdm

    mpiexec = launcher(mpiexec)
    plan = _work_plan(program, argv, ranks, weak, work_arg)
    check_plan(program, plan)
    sweep = Sweep(program, "weak" if weak else "strong")
    steps = [(n, t) for n in ranks for t in range(trials)]
    for n, t in tqdm(steps, desc=f"{program} {sweep.mode} scaling", unit="run", disable=not progress):
        args, work = plan[n]
        rec = run_once(program, args, n, mpiexec, timeout)
        sweep.records.append(_record(rec, n, t, work, timing, work_arg_for(program, work_arg)))
    return sweep


def _record(rec: dict, ranks: int, trial: int, work, timing: str, option: str | None) -> dict:
    if timing not in rec.get("timings", {}):
        raise RuntimeError(f"{rec.get('exercise')} reported no timings[{timing!r}] "
                           f"(it has {sorted(rec.get('timings', {}))}); choose one with --timing")
    if work is None and option:
        work = rec.get("result", {}).get(option.lstrip("-"))
    per_gpu = int(rec.get("ranks_per_gpu") or 1)
    return {"ranks": ranks, "trial": trial, "work": work, "wall_s": float(rec["timings"][timing]),
            "passed": bool(rec.get("passed")), "backend": rec.get("backend"),
            "ranks_per_gpu": per_gpu, "shared_gpu": per_gpu > 1}


# ---------------------------------------------------------------- route 2: ipyparallel engines

def engine_trial(program: str, argv: list[str], ranks: int):
    """Run on every engine: the first ``ranks`` engines run the program on a sub-communicator.

    Returns the report's record on the sub-communicator's rank 0, None elsewhere.
    """
    from hpclab import backend, runner
    from hpclab.device import ranks_per_gpu, select_gpu
    from hpclab.mpi import first_ranks, world

    comm = world()
    placement = select_gpu(comm)
    with first_ranks(comm, ranks) as sub:
        if sub is None:
            return None
        args = program_args(program, argv)
        per_gpu = ranks_per_gpu(sub)     # this sub-communicator's own sharing
        ctx = runner.Context(sub, dataclasses.replace(placement, rank=sub.rank, size=sub.size), backend.name())
        report = runner.load(program).run(args, ctx)
        if sub.rank != 0:
            return None
        return {"exercise": program, "ranks": sub.size, "backend": backend.name(), "result": report.result,
                "passed": bool(report.passed), "timings": report.timings, "ranks_per_gpu": per_gpu}


def sweep_engines(view, program: str, argv: list[str] | str = (), sizes: list[int] | None = None,
                  weak: bool = False, trials: int = 3, work_arg: str | None = None,
                  timing: str = "wall_s", progress: bool = True, timeout: float | None = None) -> Sweep:
    """The sweep on the engines of ``view`` (a DirectView on all of them, ordered by MPI rank).

    ``sizes`` defaults to 1, 2, 4, ... up to the number of engines (and that number).
    All trials are queued at once; ``wait_interactive`` shows their progress.
    """
    from ipyparallel.client.asyncresult import AsyncResult

    argv = shlex.split(argv) if isinstance(argv, str) else list(argv)
    n_engines = len(view.targets) if isinstance(view.targets, (list, tuple)) else len(view.client.ids)
    sizes = sorted(set(sizes or _powers_of_two(n_engines)))
    if sizes[0] < 1 or sizes[-1] > n_engines:
        raise ValueError(f"sub-communicator sizes must be 1..{n_engines} (the engines), not {sizes}")
    plan = _work_plan(program, argv, sizes, weak, work_arg)
    for n in sizes:          # the types of every option, before anything is queued on the engines
        program_args(program, plan[n][0])
    jobs = [(n, t, view.apply_async(engine_trial, program, plan[n][0], n)) for n in sizes for t in range(trials)]
    everything = AsyncResult(view.client, [f for _, _, ar in jobs for f in ar._children],
                             fname=f"{program} {'weak' if weak else 'strong'} scaling")
    if progress:
        everything.wait_interactive(timeout=-1 if timeout is None else timeout)
    everything.get(timeout)
    sweep = Sweep(program, "weak" if weak else "strong")
    for n, t, ar in jobs:
        rec = next(r for r in ar.get() if r is not None)
        sweep.records.append(_record(rec, n, t, plan[n][1], timing, work_arg_for(program, work_arg)))
    return sweep


def _powers_of_two(n: int) -> list[int]:
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return [*out, n]


# ---------------------------------------------------------------- the command

def main(argv: list[str] | None = None) -> int:
    from hpclab import plot, runner
    from hpclab.options import Parser, UsageError, count, count_list, output_folder, real

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
    try:
        args, program_argv = parser.parse_known_args(argv)
        ranks = sorted(set(args.ranks))
        runner.load(args.program)
        out = output_folder(args.out, "--out", "hpclab scaling")     # before hours of runs, not after
        mpiexec = launcher(args.mpiexec)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        sweep = sweep_mpiexec(args.program, program_argv, ranks, args.weak, args.trials, mpiexec,
                              args.work_arg, args.timing, args.timeout, progress=not args.no_progress)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as exc:
        print(f"hpclab scaling: error: {exc}", file=sys.stderr)
        return 1
    stem = f"{args.program}_{sweep.mode}"
    csv_path = sweep.write_csv(out / f"{stem}.csv")
    png_path = plot.save(sweep.figure(), stem, directory=out)
    print(sweep.table())
    print(f"wrote {csv_path} and {png_path}")
    return 0 if all(r["passed"] for r in sweep.records) else 1
