"""``python -m benchmarks NAME [options]``: one benchmark (``-h`` after NAME lists its options)."""
from __future__ import annotations

import importlib
import sys

BENCHMARKS = {          # name -> module with main(argv)
    "pi": "benchmarks.pi",
    "matmul": "benchmarks.matmul",
    "allreduce": "benchmarks.allreduce",
    "conv": "benchmarks.conv",
    "ddp": "benchmarks.ddp",
}


def main(argv: list[str]) -> int:
    from hpclab.options import UsageError

    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        known = ", ".join(BENCHMARKS)
        print(f"usage: python -m benchmarks NAME [options]\n\nNAME: {known}" if not argv or argv[0].startswith("-")
              else f"python -m benchmarks: error: unknown benchmark {argv[0]!r}; choose one of: {known}",
              file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    try:
        return importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:])
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
