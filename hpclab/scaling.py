"""Strong and weak scaling sweeps of any ``hpclab run`` program, over rank counts.

A program is its module (``hpclab.pi.run_mc``, ...: see :mod:`hpclab.runner`). Two routes, one record format:
``sweep_mpiexec`` runs ``mpiexec -n N python -m hpclab run NAME ... --json`` per rank count and trial
(``hpclab scaling``); ``sweep_engines`` runs the program's ``run(args, ctx)`` on sub-communicators of a
notebook's engines. Both check every run's arguments first. A program reports ``timings["wall_s"]``; its work
is its size option's value (``PROGRAM.work``, or ``--work-arg``), which a weak sweep multiplies by the rank
count. Speedup, efficiency and the serial fraction come from :mod:`hpclab.speedup`. A record's ``ranks_per_gpu`` > 1 (``shared_gpu``) means ranks took turns on a GPU: time sharing, not scaling.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path


from hpclab import backend, runner
from hpclab.budget import Launch
from hpclab.errors import step
from hpclab.options import UsageError, count
from hpclab.speedup import amdahl_speedup, serial_fraction, speedups  # noqa: F401 (amdahl: for notebooks)

CSV_FIELDS = ["program", "mode", "ranks", "trial", "work", "wall_s", "passed", "median_wall_s",
              "speedup", "efficiency", "serial_fraction", "backend", "ranks_per_gpu", "shared_gpu"]


@dataclass
class Sweep:
    """Every trial of a sweep (ranks, trial, work, wall_s, passed, backend, ranks_per_gpu, shared_gpu),
    and what follows from their medians."""

    program: str
    mode: str                                   # "strong" or "weak"
    records: list[dict] = field(default_factory=list)

    def sharing_note(self) -> str:
        """One line for a figure or table where ranks shared a GPU (time sharing, not scaling), else empty."""
        most = max((r.get("ranks_per_gpu") or 1 for r in self.records), default=1)
        return f"up to {most} ranks shared one GPU: this measures time sharing, not scaling" if most > 1 else ""

    def summary(self) -> list[dict]:
        """One row per rank count: median wall time, speedup, efficiency."""
        ranks = sorted({r["ranks"] for r in self.records})
        trials = {n: [r for r in self.records if r["ranks"] == n] for n in ranks}
        med = [statistics.median(r["wall_s"] for r in trials[n]) for n in ranks]
        return [{"ranks": n, "work": trials[n][0]["work"], "median_wall_s": t, "speedup": s, "efficiency": e,
                 "trials": len(trials[n]), "passed": all(r["passed"] for r in trials[n])}
                for n, t, (s, e) in zip(ranks, med, speedups(ranks, med, self.mode))]

    @property
    def serial_fraction(self) -> float:
        rows = self.summary()
        return serial_fraction([r["ranks"] for r in rows], [r["speedup"] for r in rows], self.mode)

    def write_csv(self, path) -> Path:
        """Each trial, with its rank count's summary beside it."""
        by_n, f = {r["ranks"]: r for r in self.summary()}, self.serial_fraction
        with Path(path).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, CSV_FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**rec, "program": self.program, "mode": self.mode, "serial_fraction": f,
                              **{k: by_n[rec["ranks"]][k] for k in ("median_wall_s", "speedup", "efficiency")}}
                             for rec in sorted(self.records, key=lambda r: (r["ranks"], r["trial"])))
        return Path(path)

    def figure(self, note: str | None = None):
        """Speedup and efficiency with the fitted law; ``note``: a sentence under the figure (a notebook gives
        ``plot.machine_note(sweep.records)``: what this machine's timings can show)."""
        from hpclab.results import plot       # matplotlib: only when a figure is asked for

        sharing = self.sharing_note()
        title = f"{self.program}: {self.mode} scaling" + (f"\n({sharing})" if sharing else "")
        return plot.scaling_figure(self.summary(), self.mode, self.serial_fraction, title, note)

    def table(self) -> str:
        lines = [f"{'ranks':>5}  {'work':>16}  {'median wall (s)':>15}  {'speedup':>8}  {'efficiency':>10}  "
                 "trials  check"]
        for r in self.summary():
            lines.append(f"{r['ranks']:>5}  {r['work'] if r['work'] is not None else '-':>16}  "
                         f"{r['median_wall_s']:>15.6f}  {r['speedup']:>8.3f}  {r['efficiency']:>10.3f}  "
                         f"{r['trials']:>6}  {'PASSED' if r['passed'] else 'FAILED'}")
        law = "Amdahl" if self.mode == "strong" else "Gustafson"
        lines.append(f"serial fraction ({law} fit): {self.serial_fraction:.4f}")
        if self.sharing_note():
            lines.append(f"note: {self.sharing_note()}")
        return "\n".join(lines)


# ---------------------------------------------------------------- program arguments

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


def _work_plan(program, argv, ranks, weak, work_arg) -> dict:
    """{ranks: (argv, work)} of a sweep, every run passing ``hpclab run``'s checks before the first starts: the
    lenient check (GPU speed, no memory limit), for the runs may land elsewhere (``--mpiexec srun`` from a login
    node) and check again there; where no backend can be chosen here, the options' types and ranges only."""
    option = work_arg or program.PROGRAM.work
    if weak and not (option and _find_value(argv, option)):
        raise UsageError(f"hpclab scaling: error: a weak sweep scales the work with the ranks: give the "
                         f"per-rank work, e.g. {option or '--work-arg --size'} N (for pi-mc: --samples 1e9)")
    plan = {n: scaled_args(argv, option, n if weak else 1) for n in ranks}
    try:
        backend.select()
        lenient = True
    except backend.BackendError:
        lenient = False
    for n, (args, _) in plan.items():
        runner.checked(program, args, Launch(n, 1, "gpu", math.inf) if lenient else None)
    return plan


# ---------------------------------------------------------------- route 1: mpiexec

def launcher(text: str | None = None) -> list[str]:
    """The launcher command: --mpiexec's, else ``$HPCLAB_MPIEXEC`` (a whole command line), else the
    mpiexec beside this Python, else on PATH; its program must exist."""
    if text is None and os.environ.get("HPCLAB_MPIEXEC", "").strip():
        return shlex.split(os.environ["HPCLAB_MPIEXEC"])
    if text is None:
        here = Path(sys.executable).parent / "mpiexec"
        found = str(here) if here.exists() else shutil.which("mpiexec") or shutil.which("mpirun")
        if not found:
            raise UsageError("hpclab scaling: error: no mpiexec beside this Python or on PATH: install MPI "
                             "(pip install 'hpclab[mpi]', or module load openmpi) or name the launcher with "
                             "--mpiexec")
        return [found]
    try:
        cmd = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"hpclab scaling: error: --mpiexec {text!r}: {exc}") from None
    if not cmd or not (shutil.which(cmd[0]) or Path(cmd[0]).is_file()):
        raise UsageError(f"hpclab scaling: error: --mpiexec {text!r}: no program "
                         f"{cmd[0] if cmd else ''!r} found (not a file, not on PATH); give the launcher "
                         "of your MPI, e.g. --mpiexec mpirun")
    return cmd


def run_once(program, argv: list[str], ranks: int, mpiexec: list[str], timeout: float = 600) -> dict:
    """One ``mpiexec -n ranks python -m hpclab run NAME argv --json`` of the program (its module); its JSON record."""
    name = program.PROGRAM.name
    cmd = [*mpiexec, "-n", str(ranks), sys.executable, "-m", "hpclab", "run", name, *argv, "--json"]
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
                raise RuntimeError(f"{name} on {ranks} rank(s) failed: {record['error']}")
            return record
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
    raise RuntimeError(f"{shlex.join(cmd)} exited with {proc.returncode} and no JSON line:\n{tail}")


def sweep_mpiexec(program, argv: list[str], ranks: list[int], weak: bool = False, trials: int = 3,
                  mpiexec: str | None = None, work_arg: str | None = None,
                  timing: str = "wall_s", timeout: float = 600, progress: bool = True) -> Sweep:
    """Run the program (its module) under mpiexec for each rank count, ``trials`` times each."""
    from tqdm.auto import tqdm

    mpiexec = launcher(mpiexec)
    plan = _work_plan(program, argv, ranks, weak, work_arg)
    sweep = Sweep(program.PROGRAM.name, "weak" if weak else "strong")
    steps = [(n, t) for n in ranks for t in range(trials)]
    for n, t in tqdm(steps, desc=f"{sweep.program} {sweep.mode} scaling", unit="run", disable=not progress):
        args, work = plan[n]
        rec = run_once(program, args, n, mpiexec, timeout)
        sweep.records.append(_record(rec, n, t, work, timing, work_arg or program.PROGRAM.work))
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

def engine_trial(program, argv: list[str], ranks: int):
    """Run on every engine: the first ``ranks`` engines run the program (its module, or the module's dotted
    name as ``sweep_engines`` sends it) on a sub-communicator after the checks of ``hpclab run`` for that
    launch (bad input raises on each). The record on its rank 0, else None."""
    from hpclab.device import ranks_per_gpu, select_gpu
    from hpclab.mpi import first_ranks, world

    program = importlib.import_module(program) if isinstance(program, str) else program
    comm = world()
    placement = select_gpu(comm)
    with first_ranks(comm, ranks) as sub:
        if sub is None:
            return None
        with step(sub, "input check"):
            module, args = runner.checked(program, argv, runner.launch_of(sub))
        per_gpu = ranks_per_gpu(sub)     # this sub-communicator's own sharing
        ctx = runner.Context(sub, replace(placement, rank=sub.rank, size=sub.size), backend.name())
        report = module.run(args, ctx)
        if sub.rank != 0:
            return None
        return {"exercise": program.PROGRAM.name, "ranks": sub.size, "backend": backend.name(), "result": report.result,
                "passed": bool(report.passed), "timings": report.timings, "ranks_per_gpu": per_gpu}


def sweep_engines(view, program, argv: str, trials: int = 3, weak: bool = False) -> Sweep:
    """The strong sweep of the program (its module) on the engines of ``view`` (a DirectView on all of them),
    on 1, 2, 4, ... and all of them; with ``weak``, the weak sweep: ``argv`` gives the work per rank (the
    program's size option), multiplied by each run's rank count. The trials are queued at once and
    ``wait_interactive`` shows their progress. The engines import the module by its name."""
    from ipyparallel.client.asyncresult import AsyncResult

    n_engines = len(view.targets) if isinstance(view.targets, (list, tuple)) else len(view.client.ids)
    sizes = [2 ** k for k in range(n_engines.bit_length()) if 2 ** k < n_engines] + [n_engines]
    plan = _work_plan(program, shlex.split(argv), sizes, weak, None)      # before anything is queued
    name, mode = program.PROGRAM.name, "weak" if weak else "strong"
    jobs = [(n, t, view.apply_async(engine_trial, program.__name__, plan[n][0], n)) for n in sizes for t in range(trials)]
    everything = AsyncResult(view.client, [f for _, _, ar in jobs for f in ar._children],
                             fname=f"{name} {mode} scaling")
    everything.wait_interactive()
    everything.get()
    sweep = Sweep(name, mode)
    for n, t, ar in jobs:
        rec = next(r for r in ar.get() if r is not None)
        sweep.records.append(_record(rec, n, t, plan[n][1], "wall_s", program.PROGRAM.work))
    return sweep
