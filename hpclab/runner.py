"""Run one workshop program on every MPI rank (``hpclab run NAME``).

A program is a module (docs/architecture.md, *Programs are modules*); the runner does the rest for all of them:
input checks (:func:`checked`, also on notebook engines), backend and GPU selection, the per-rank lines in rank
order, the FINAL RESULTS block (the workshop's format), the JSON line, and errors reported on every rank with a
non-zero exit instead of a hang. MPI starts even where a rank's check failed, and one ``allgather`` of the
outcomes follows: a rank whose environment or arguments differ (an MPMD launch, a node without a GPU) stops every
rank with its message instead of leaving them waiting in their first collective. Bad input exits with 2.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

from hpclab import backend
from hpclab.budget import Launch
from hpclab.device import local_rank, select_gpu
from hpclab.errors import RankError, step
from hpclab.options import Parser, UsageError

ABORT_GRACE_S = 1.0     # how long a failing rank waits between its message and MPI_Abort


@dataclass(frozen=True)
class Program:
    """What the harness knows of a program besides its code."""

    name: str                       # for `hpclab run NAME`
    topic: str                      # its notebook's topic: the curated table it is recorded in
    work: str | None = None         # the size option a weak scaling sweep multiplies by the ranks
    unit: str = "work"              # what a sweep's work (that option, or --work-arg) counts


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


def checked(module, argv: list[str], launch: Launch | None = None):
    """(module, args): the program's arguments as ``hpclab run NAME ARGV`` gets them, and with ``launch``
    checked against it (ranks, backend, memory). Raises :class:`UsageError` naming the option, the value and
    what is allowed."""
    name = module.PROGRAM.name
    parser = Parser(prog=f"hpclab run {name}", description=module.HELP)
    module.add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="end rank 0's output with one JSON line")
    args = parser.parse_args(argv)
    if launch is not None and hasattr(module, "validate"):
        try:
            module.validate(args, launch)
        except ValueError as exc:          # UsageError, or a check shared with the library
            raise UsageError(f"hpclab run {name}: error: {exc}") from None
    return module, args


def launch_of(comm) -> Launch:
    """Ranks, ranks on this node and backend (a collective: every rank calls it)."""
    return Launch(comm.size, local_rank(comm)[1], backend.selected() or "sim")


def agree(comm, problem: str | None) -> str | None:
    """Every rank's start-up outcome, gathered; the first failure in words (None if none)."""
    outcomes = comm.allgather(problem)
    failures = {r: p for r, p in enumerate(outcomes) if p is not None}
    if not failures:
        return None
    first_rank, first = next(iter(failures.items()))
    if len(failures) == comm.size and len(set(failures.values())) == 1:
        return first
    where = f"rank {first_rank}" if len(failures) == 1 else "ranks " + ", ".join(map(str, failures))
    return f"{first} (on {where} of {comm.size})"


def _problem(prog: str, exc: Exception) -> str:
    """What stops this rank before the run, in one line."""
    if isinstance(exc, UsageError):
        return str(exc)
    if isinstance(exc, backend.BackendError):
        return f"{prog}: error: {exc}"
    return f"{prog}: error: {type(exc).__name__}: {exc}"


def _say(rank: int, message: str) -> None:
    print(f"[rank {rank}] error: {message}", file=sys.stderr, flush=True)


def _json(wanted: bool, name: str, size: int, **fields) -> None:
    """Where ``--json`` was asked for, the run's JSON line: its result, or the ``error`` that stopped it."""
    if wanted:
        print(json.dumps({"exercise": name, "ranks": size, "backend": backend.selected(), "result": {},
                          "passed": False, "timings": {}, **fields}, default=float), flush=True)


def main(program, argv: list[str], name: str | None = None) -> int:
    """``hpclab run``: the program on every rank of this MPI job; the exit status. ``program`` is its module, or
    what loads it (``hpclab.programs.load``): a rank that cannot import it (no GPU there, a module missing) must
    still reach MPI and tell the others."""
    name = name or program.PROGRAM.name
    prog = f"hpclab run {name}"
    want_json = "--json" in argv
    problem, module, args = None, None, None
    try:
        program = program() if callable(program) else program
        module, args = checked(program, argv)
        want_json = args.json
        backend.select()
    except Exception as exc:  # noqa: BLE001 - e.g. a module missing on one node: the others must hear of it
        problem = _problem(prog, exc)

    from hpclab.mpi import MPIUnavailable, world

    try:                 # even where this rank's check failed: the others must hear of it
        comm = world()
    except MPIUnavailable as exc:
        print(problem or f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        _json(want_json, name, 1, error=problem or str(exc))
        return 2
    rank = comm.rank
    launch = launch_of(comm)
    if problem is None:
        try:
            checked(program, argv, launch)
        except Exception as exc:  # noqa: BLE001 - whatever stops this rank must reach the others
            problem = _problem(prog, exc)
    problem = agree(comm, problem)
    if problem is not None:
        if rank == 0:
            print(problem, file=sys.stderr, flush=True)
            _json(want_json, name, comm.size, error=problem)
        return 2

    try:
        with step(comm, "GPU selection"):
            placement = select_gpu(comm)
        backend.banner(rank)
        ctx = Context(comm, placement, backend.name())
        report = module.run(args, ctx)
        lines = comm.gather(report.rank_line, root=0)
    except RankError as exc:  # raised on every rank alike: all exit cleanly
        _say(rank, str(exc))
        _json(rank == 0 and want_json, name, comm.size, error=str(exc))
        return 1
    except Exception as exc:  # this rank alone may have failed: never leave the rest waiting
        if isinstance(exc, (ValueError, backend.BackendError)):
            _say(rank, str(exc))
        else:
            traceback.print_exc()
            _say(rank, f"{type(exc).__name__}: {exc}")
        # rank 0 may be waiting in a collective: the failing rank writes the JSON line
        _json(want_json, name, comm.size, error=f"{type(exc).__name__} on rank {rank}: {exc}", rank=rank)
        _say(rank, "aborting all ranks")
        sys.stderr.flush()
        # mpiexec passes a rank's output on by itself, and MPI_Abort has it kill every process: give it a moment to
        # pass this message on first (on a loaded machine MPICH's mpiexec lost it)
        time.sleep(ABORT_GRACE_S)
        comm.Abort(1)
        return 1
    if rank == 0:
        print(*filter(None, lines), "", sep="\n")           # the rank lines, then a blank line
        final = [*report.final, ("Check", "PASSED" if report.passed else "FAILED")]
        width = max(len(k) for k, _ in final)
        print("\n".join(["===== FINAL RESULTS =====", *(f"{k:<{width}} = {v}" for k, v in final)]))
        for note in report.notes:
            print(f"note: {note}")
        sys.stdout.flush()
        _json(args.json, name, comm.size, ranks_per_gpu=ctx.placement.max_ranks_per_gpu,  # > 1: turns on a GPU
              result=report.result, passed=bool(report.passed), timings=report.timings)
    return 0 if report.passed else 1


def env_rank() -> int:
    """This process's rank from the launcher's environment, before MPI starts (0 alone)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0
