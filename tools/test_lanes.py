"""``make test``: the whole suite in four pytest processes side by side, then one summary.

The lanes: the notebooks and everything else that drives engines; the two halves of the Slurm tier, each on a
Slurm of its own, whose tests mostly wait for jobs; and the library's tests (every other file of tests/ and
benchmarks/tests/, found anew each run, so a new test file always runs). More lanes do not help on two cores:
MPI ranks spin while they wait, and six lanes ran slower than three; moving files from the longer lanes to the
first Slurm half, which ends first, did not shorten the run either (957 s against 956 s: the two cores are the
limit). Each lane has its own IPython directory
(conftest.py), so their engines never meet. Each prints its slowest tests (--durations), so every run shows where
the time goes; a lane's output is shown whole when it ends, and the exit status is 1 if any lane failed.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANES = {
    "engines": ["notebooks", "solutions", "tests/test_cluster.py", "tests/test_exercise_stubs.py"],
    "slurm": ["tests/test_slurm.py", "tests/test_slurm_module.py", "tests/test_slurm_gpu.py"],
    "slurm-engines": ["tests/test_slurm_engines.py"],
}
COMMON = ["-q", "-rs", "--durations=15", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-cell-timeout=900"]


def lanes() -> dict[str, list[str]]:
    taken = {p for paths in LANES.values() for p in paths}
    rest = [str(p.relative_to(ROOT)) for folder in ("tests", "benchmarks/tests")
            for p in sorted((ROOT / folder).glob("test_*.py")) if str(p.relative_to(ROOT)) not in taken]
    return {**LANES, "library": rest}


def main() -> int:
    logs, procs, t0 = ROOT / "build" / "test-lanes", {}, time.monotonic()
    logs.mkdir(parents=True, exist_ok=True)
    for name, paths in lanes().items():
        log = open(logs / f"{name}.log", "w")
        procs[name] = (subprocess.Popen([sys.executable, "-m", "pytest", *COMMON, *paths], cwd=ROOT, stdout=log,
                                        stderr=subprocess.STDOUT), log)
        print(f"lane {name}: pytest {' '.join(paths)}", flush=True)
    failed, done = [], set()
    while len(done) < len(procs):
        for name, (proc, log) in procs.items():
            if name in done or proc.poll() is None:
                continue
            done.add(name)
            log.close()
            print(f"\n===== lane {name}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s\n"
                  + (logs / f"{name}.log").read_text(errors="replace"), flush=True)
            if proc.returncode != 0:
                failed.append(name)
        time.sleep(1)
    print(f"make test: {len(procs)} lanes in {time.monotonic() - t0:.0f} s; "
          + (f"FAILED: {', '.join(failed)}" if failed else "all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
