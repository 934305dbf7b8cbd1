"""Test-session setup: a private IPython profile directory, the simulator, and
(when notebooks are collected) one shared cluster of MPI engines that the notebooks
claim one after another (``hpclab.cluster``: each notebook's connect() claims it,
its session.close() gives it back with an empty namespace)."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# Before anything imports numba.cuda: tests run on the simulator unless told otherwise
# (HPCLAB_BACKEND=gpu runs the same tests on a real GPU).
os.environ.setdefault("HPCLAB_BACKEND", "sim")
# Our own clusters must not meet a user's (or another test run's) ipcluster.
os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="hpclab-ipython-"))
os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
# mpiexec beside this Python (mpich wheel) first on PATH, for ipyparallel's MPI launcher.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("HPCLAB_FIGURES", tempfile.mkdtemp(prefix="hpclab-figures-"))

_shared = None


def pytest_collection_finish(session):
    """Start the shared cluster of 4 MPI engines once if any notebook is to be executed."""
    global _shared
    if any(item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid for item in session.items):
        from hpclab import cluster

        _shared = cluster.start_shared(n=int(os.environ.get("HPCLAB_ENGINES", "4")))


def pytest_sessionfinish(session, exitstatus):
    if _shared is not None:
        _shared.stop()
