"""Helpers for tests that run hpclab programs under a real mpiexec."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel puts it there), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec: install the test environment with `make test` "
                           "(pip install -e '.[test,mpi]')")
    return found


def launcher() -> list[str]:
    """The MPI launcher command: ``$HPCLAB_MPIEXEC``, else ``$MPIRUN`` (benchmarks/offline_env.sh
    sets it for Open MPI's mpirun as root on the GPU machines), else :func:`mpiexec`."""
    for var in ("HPCLAB_MPIEXEC", "MPIRUN"):
        if os.environ.get(var, "").strip():
            return shlex.split(os.environ[var])
    return [mpiexec()]


def gpus() -> int:
    """GPUs the driver reports here (0 on a machine without one)."""
    from hpclab import backend

    return backend.count_gpus()


def env(**extra) -> dict:
    e = dict(os.environ)
    e.setdefault("HPCLAB_BACKEND", "sim")
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run_mpi(n: int, *args: str, timeout: float = 120, module: str = "hpclab", **extra_env) -> subprocess.CompletedProcess:
    """``mpiexec -n n python -m MODULE ARGS`` (hpclab, or benchmarks); fails the test if it outlives timeout."""
    cmd = [*launcher(), "-n", str(n), sys.executable, "-m", module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**extra_env),
                          cwd=ROOT)


def run_hpclab(*args: str, timeout: float = 120, **extra_env) -> subprocess.CompletedProcess:
    """``python -m hpclab ARGS`` as a single process (MPI singleton)."""
    return subprocess.run([sys.executable, "-m", "hpclab", *args], capture_output=True, text=True,
                          timeout=timeout, env=env(**extra_env), cwd=ROOT)


def run_benchmark(*args: str, timeout: float = 120, **extra_env) -> subprocess.CompletedProcess:
    """``python -m benchmarks ARGS`` from the checkout, as a single process."""
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True,
                          timeout=timeout, env=env(**extra_env), cwd=ROOT)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object on the last line of stdout."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"no output; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])
