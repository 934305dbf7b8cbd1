"""The ``hpclab`` command (also ``python -m hpclab``).

  hpclab info                      backend, GPUs, MPI, NCCL, ipyparallel
  hpclab run NAME [options]        a workshop program (under mpiexec/srun, or alone)
  hpclab bench NAME [options]      a benchmark (its topic's bench.py: hpclab.topics)
  hpclab scaling NAME [options]    strong/weak scaling sweep, CSV + PNG
  hpclab exercises build|check     exercises/ generated from solutions/ (cells shared with notebooks/ filled in)
  hpclab exercises link [NB ...]   mark the solution cells that copy a lesson cell (--dry-run: only count them)
  hpclab exercises copy            your working copies in my-work/ (never overwritten)
  hpclab workbook [--engines N]    execute every notebook on MPI engines into build/
  hpclab cluster init --slurm ...  a profile whose engines are a Slurm job
  hpclab cluster start|status|stop the profile's MPI engines outside notebooks (hpclab.cluster)
"""
from __future__ import annotations

import argparse
import importlib
import sys

from hpclab.options import Parser, UsageError, count
from hpclab.topics import BENCHMARKS, PROGRAMS


def _info(args) -> int:
    from hpclab import backend

    rows = []
    problem = None
    try:
        choice = backend.select()
        rows.append(("backend", backend.describe(choice)))
    except backend.BackendError as exc:
        rows.append(("backend", f"ERROR: {exc}"))
        choice, problem = None, f"hpclab info: error: {exc}"
    rows.append(("GPUs (driver)", str(backend.count_gpus())))
    if choice == "gpu":
        cuda = backend.cuda()
        for i, gpu in enumerate(cuda.gpus):
            with gpu:
                dev = cuda.get_current_device()
                name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
                cc = ".".join(map(str, dev.compute_capability))
                rows.append((f"  GPU {i}", f"{name} (compute {cc}, {dev.MULTIPROCESSOR_COUNT} SMs) {dev.uuid}"))
    comm = None
    try:
        from hpclab import mpi

        comm = mpi.world()
        rows.append(("MPI", mpi.library()))
        rows.append(("MPI ranks", str(comm.size)))
        aware, how = mpi.cuda_aware()
        rows.append(("CUDA-aware MPI", f"{'yes' if aware else 'no'} ({how})"))
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        rows.append(("MPI", f"not available: {exc}"))
    if comm is not None and choice is not None:
        rows += _placement_rows(comm)
    rows.append(("NCCL", _nccl_status()))
    for pkg in ("numba", "numba_cuda", "numpy", "mpi4py", "ipyparallel"):
        rows.append((pkg, _version(pkg)))
    width = max(len(k) for k, _ in rows)
    if _rank() == 0:
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
        if problem:
            print(problem, file=sys.stderr)
    return 2 if problem else 0


def _placement_rows(comm) -> list[tuple[str, str]]:
    """Which ranks use which GPU (under mpiexec: how many share each) and what ``auto`` picks.

    Collective: every rank of the job runs ``hpclab info``; a failure on one rank is
    reported by all (no rank left waiting).
    """
    from hpclab.errors import RankError, step
    from hpclab.comm import choose
    from hpclab.device import select_gpu

    try:
        with step(comm, "GPU selection"):
            select_gpu(comm)
        everyone = comm.allgather(select_gpu(comm))
        choice, why = choose(comm)
    except RankError as exc:
        return [("GPU placement", f"ERROR: {exc}")]
    devices: dict[str, list] = {}
    for p in everyone:
        devices.setdefault(p.gpu_uuid, []).append(p)
    rows = []
    for ps in devices.values():
        p = ps[0]
        ident = "simulated device" if p.gpu_uuid.startswith("sim-") else f"{p.gpu_name}, {p.gpu_uuid}"
        ranks = ", ".join(str(q.rank) for q in ps)
        share = f" ({len(ps)} ranks share it)" if len(ps) > 1 else ""
        rows.append((f"  {p.host} GPU {p.gpu}", f"rank{'s' if len(ps) > 1 else ''} {ranks}{share}; {ident}"))
    most = max(len(ps) for ps in devices.values())
    head = (f"{len(devices)} GPU(s) used by {comm.size} rank(s)"
            + (f", up to {most} ranks per GPU" if most > 1 else ", one rank per GPU"))
    return [("ranks per GPU", head), *rows, ("comm backend (auto)", f"{choice}: {why}")]


def _nccl_status() -> str:
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001 - ImportError or a CUDA library missing
        return f"not importable (cupy.cuda.nccl: {type(exc).__name__}); pip install 'hpclab[gpu]'"
    try:
        v = nccl.get_version()
        return f"cupy.cuda.nccl, NCCL {v // 10000}.{v // 100 % 100}.{v % 100}"
    except Exception:  # noqa: BLE001
        return "cupy.cuda.nccl importable"


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg.replace("_", "-"))
    except PackageNotFoundError:
        return "not installed"


def _rank() -> int:
    from hpclab.runner import env_rank

    return env_rank()


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as exc:
        # Bad input: one line, exit status 2 (``hpclab run`` reports its own, agreed across ranks).
        if _rank() == 0:
            print(exc, file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # A Python without hpclab's dependencies (not the project's .venv) fails on first use of one;
        # say which Python and how to get the environment instead of a bare traceback.
        if (exc.name or "hpclab").split(".")[0] == "hpclab":
            raise
        print(f"hpclab: this Python ({sys.executable}) has no module {exc.name!r}, which this command "
              "needs. Use the project's environment: `make setup` (workbook) or `make test` (tests) "
              "creates .venv, then run .venv/bin/python -m hpclab ...; or install hpclab into this "
              "Python with pip install -e '.[test]' ('.[gpu]' for CuPy and NCCL).", file=sys.stderr)
        return 1


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = Parser(prog="hpclab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="what this machine offers: backend, GPUs, MPI, NCCL")
    run = sub.add_parser("run", help="run a workshop program on every rank", add_help=False)
    run.add_argument("name", nargs="?", help=", ".join(sorted(PROGRAMS)))
    bench = sub.add_parser("bench", help="run a benchmark", add_help=False)
    bench.add_argument("name", nargs="?", help=", ".join(sorted(BENCHMARKS)))
    sub.add_parser("scaling", help="strong/weak scaling sweep over rank counts (see hpclab scaling -h)",
                   add_help=False)
    ex = sub.add_parser("exercises", help="generate or check exercises/ from solutions/, or copy them to my-work/")
    ex.add_argument("action", choices=["build", "check", "copy", "link"])
    ex.add_argument("notebooks", nargs="*", help="link: solution notebooks (default: all of solutions/)")
    ex.add_argument("--root", default=".", help="project root (default .)")
    ex.add_argument("--dry-run", action="store_true", help="link: say what would be linked, write nothing")
    wb = sub.add_parser("workbook", help="execute every notebook on MPI engines into build/")
    wb.add_argument("--engines", type=count(1, 1024), default=4)
    wb.add_argument("--notebooks", default="notebooks")
    wb.add_argument("--out", default="build")
    wb.add_argument("--timeout", type=count(1, 7 * 86400), default=1200, help="seconds per cell")
    from hpclab.cluster.command import add_parser as add_cluster_parser

    add_cluster_parser(sub)

    args, rest = parser.parse_known_args(argv)
    if args.command == "info":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _info(args)
    if args.command in ("run", "bench"):
        names = sorted(PROGRAMS if args.command == "run" else BENCHMARKS)
        if not args.name or args.name in ("-h", "--help"):
            print(f"usage: hpclab {args.command} NAME [options]\n\navailable: {', '.join(names)}")
            return 0 if args.name else 2
        if args.command == "run":
            from hpclab.runner import main as run_main

            return run_main(args.name, rest)
        if args.name not in names:
            raise UsageError(f"hpclab bench: error: unknown benchmark {args.name!r}; choose one of: "
                             f"{', '.join(names)}")
        return importlib.import_module(BENCHMARKS[args.name]).main(rest)
    if args.command == "scaling":
        from hpclab import scaling

        return scaling.main(rest)
    if args.command == "exercises" and not any(r.startswith("-") for r in rest):
        from hpclab import exercises

        # notebooks named after an option arrive in rest (argparse gives * positionals their values once)
        return exercises.main(args.action, args.root, args.notebooks + rest, args.dry_run)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "workbook":
        from hpclab import workbook

        return workbook.main(args.notebooks, args.out, args.engines, args.timeout)
    if args.command == "cluster":
        return _cluster(args)
    return 2


def _cluster(args) -> int:
    from hpclab.cluster.command import main

    return main(args)
