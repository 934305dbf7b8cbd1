"""Run one workshop program on every MPI rank (``hpclab run NAME``).

A program is a module ``hpclab.programs.<name with _ for ->`` defining
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args, ctx) -> Report``.
The runner does everything around it, the same way for all programs:
backend and GPU selection, the per-rank lines in rank order, the FINAL
RESULTS block (the workshop's format), the JSON line, and errors reported on
every rank with a non-zero exit instead of a hang.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import traceback
from dataclasses import dataclass, field

from . import backend


@dataclass
class Report:
    """What a program hands back on each rank."""

    rank_line: str = ""                                    # this rank's line
    final: list[tuple[str, str]] = field(default_factory=list)  # rank 0's FINAL RESULTS
    result: dict = field(default_factory=dict)            # machine-readable answer
    passed: bool = False                                   # the program's self-check
    timings: dict = field(default_factory=dict)           # seconds
    notes: list[str] = field(default_factory=list)        # why a check failed, caveats


@dataclass
class Context:
    comm: object
    placement: object
    backend: str


class UsageError(ValueError):
    """Bad input detected identically on every rank (so no communication needed)."""


def program_names() -> list[str]:
    from . import programs

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(programs.__path__)
                  if not m.name.startswith("_"))


def load(name: str):
    names = program_names()
    if name not in names:
        raise UsageError(f"unknown exercise {name!r}; choose one of: {', '.join(names)}")
    return importlib.import_module(f"hpclab.programs.{name.replace('-', '_')}")


def parse_count(text: str) -> int:
    """Accept 1e10, 10000000000, 1_000 or 2**20 style counts (argparse type)."""
    try:
        value = float(text.replace("_", "")) if "**" not in text else float(eval(text, {"__builtins__": {}}))
    except (ValueError, SyntaxError, TypeError, NameError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 1e10 or 1000000)") from None
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return int(value)


def _format_final(final: list[tuple[str, str]]) -> str:
    width = max((len(k) for k, _ in final), default=0)
    return "\n".join(["===== FINAL RESULTS =====", *(f"{k:<{width}} = {v}" for k, v in final)])


def _say(rank: int, message: str) -> None:
    print(f"[rank {rank}] error: {message}", file=sys.stderr, flush=True)


def main(name: str, argv: list[str]) -> int:
    # Input the same on every rank is checked before any communication, so
    # every rank raises the same error on its own: nobody is left waiting.
    rank = _env_rank()
    try:
        module = load(name)
        parser = argparse.ArgumentParser(prog=f"hpclab run {name}", description=module.HELP)
        module.add_arguments(parser)
        parser.add_argument("--json", action="store_true",
                            help="end rank 0's output with one JSON line")
        args = parser.parse_args(argv)
        backend.select()
    except (UsageError, backend.BackendError) as exc:
        _say(rank, str(exc))
        return 2

    from .comm import RankError, step
    from .device import select_gpu
    from .mpi import MPIUnavailable, world

    try:
        comm = world()
    except MPIUnavailable as exc:
        _say(rank, str(exc))
        return 2
    rank = comm.rank
    try:
        with step(comm, "GPU selection"):
            placement = select_gpu(comm)
        backend.banner(rank)
        ctx = Context(comm, placement, backend.name())
        report = module.run(args, ctx)
        lines = comm.gather(report.rank_line, root=0)
    except RankError as exc:  # raised on every rank alike: all exit cleanly
        _say(rank, str(exc))
        return 1
    except Exception as exc:  # this rank alone may have failed: never leave the rest waiting
        if isinstance(exc, (ValueError, backend.BackendError)):
            _say(rank, str(exc))
        else:
            traceback.print_exc()
        _say(rank, "aborting all ranks")
        sys.stderr.flush()
        comm.Abort(1)
        return 1
    if rank == 0:
        for line in lines:
            if line:
                print(line)
        print()
        print(_format_final([*report.final, ("Check", "PASSED" if report.passed else "FAILED")]))
        for note in report.notes:
            print(f"note: {note}")
        if args.json:
            print(json.dumps({
                "exercise": name, "ranks": comm.size, "backend": ctx.backend,
                "ranks_per_gpu": ctx.placement.max_ranks_per_gpu,   # > 1: ranks took turns on a GPU
                "result": report.result, "passed": bool(report.passed),
                "timings": report.timings,
            }, default=float))
        sys.stdout.flush()
    return 0 if report.passed else 1


def _env_rank() -> int:
    import os

    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0
