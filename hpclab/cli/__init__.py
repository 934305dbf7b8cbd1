"""The ``hpclab`` command (also ``python -m hpclab``); ``hpclab COMMAND -h`` for each command's options."""
from __future__ import annotations

import importlib
import sys

from hpclab.options import Parser, UsageError, count
from hpclab.programs import PROGRAMS
from hpclab.runner import env_rank


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as exc:
        # Bad input: one line, exit status 2 (``hpclab run`` reports its own, agreed across ranks).
        if env_rank() == 0:
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
    parser = Parser(prog="hpclab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="what this machine offers: backend, GPUs, MPI, NCCL").set_defaults(
        handler=lambda args, rest: _command("doctor").info() if not rest else _unknown(rest))
    sub.add_parser("doctor", help="pre-flight of every requirement, with fixes (see hpclab doctor -h)",
                   add_help=False).set_defaults(handler=lambda args, rest: _command("doctor").main(rest))
    named = sub.add_parser("run", help="run a workshop program on every rank", add_help=False)  # NAME's options follow
    named.add_argument("name", nargs="?", help=", ".join(sorted(PROGRAMS)))
    named.set_defaults(handler=_run)
    sub.add_parser("scaling", help="strong/weak scaling sweep over rank counts (see hpclab scaling -h)",
                   add_help=False).set_defaults(handler=lambda args, rest: _command("scaling").main(rest))
    ex = sub.add_parser("exercises", help="generate or check exercises/ from solutions/, or copy them to my-work/")
    ex.add_argument("action", choices=["build", "check", "copy", "link"])
    ex.add_argument("notebooks", nargs="*", help="link: solution notebooks (default: all of solutions/)")
    ex.add_argument("--root", default=".", help="project root")
    ex.add_argument("--dry-run", action="store_true", help="link: say what would be linked, write nothing")
    ex.set_defaults(handler=_exercises)
    wb = sub.add_parser("workbook", help="execute every notebook on MPI engines into build/")
    wb.add_argument("--engines", type=count(1, 1024), default=4, help="MPI engines the notebooks run on")
    wb.add_argument("--notebooks", default="notebooks", help="folder of NN_*.ipynb to run in order")
    wb.add_argument("--out", default="build", help="folder for the executed copies and figures/")
    wb.add_argument("--timeout", type=count(1, 7 * 86400), default=1200, help="seconds per cell")
    wb.add_argument("--login-node", action="store_true", help="each notebook's kernel as on a cluster's login node: "
                    "no GPU in its own process, the engines have them (HPCLAB_LOGIN_NODE)")
    wb.set_defaults(handler=lambda args, rest: _command("workbook").main(
        args.notebooks, args.out, args.engines, args.timeout, args.login_node) if not rest else _unknown(rest))
    # hpclab.cluster imports ipyparallel: only when the command runs (every rank of `hpclab run` starts here)
    sub.add_parser("cluster", help="start, list or stop the profile's MPI engines; init --slurm: engines from Slurm",
                   add_help=False).set_defaults(handler=lambda args, rest: importlib.import_module("hpclab.cluster.command").main(rest))

    args, rest = parser.parse_known_args(argv)
    return args.handler(args, rest)


def _command(name: str):
    """hpclab.cli.NAME, imported when its command runs (each pulls in what it needs, e.g. nbformat)."""
    return importlib.import_module(f"hpclab.cli.{name}")


def _unknown(rest: list[str]) -> int:
    raise UsageError(f"hpclab: error: unrecognized arguments: {' '.join(rest)}")


def _run(args, rest) -> int:
    """``hpclab run NAME ...``; without a NAME, or with -h, the list of names (exit status 0 with -h, else 2)."""
    if not args.name or args.name in ("-h", "--help"):
        print(f"usage: hpclab run NAME [options]\n\navailable: {', '.join(sorted(PROGRAMS))}")
        return 0 if args.name else 2
    from hpclab import programs, runner

    if args.name not in programs.PROGRAMS:
        programs.load(args.name)            # the unknown name, said as a usage error
    return runner.main(lambda: programs.load(args.name), rest, args.name)


def _exercises(args, rest) -> int:
    if any(r.startswith("-") for r in rest):
        return _unknown(rest)
    # notebooks named after an option arrive in rest (argparse gives * positionals their values once)
    return _command("exercises").main(args.action, args.root, args.notebooks + rest, args.dry_run)
