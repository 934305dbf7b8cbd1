"""Test-session setup: a private IPython profile directory, the simulator, and
(when notebooks are collected) one set of MPI engines shared by all notebooks."""
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
# The suite starts engines next to itself even where sbatch is installed and no GPU is (CI, once the
# Slurm tier has installed Slurm): hpclab.slurm.login_node_guard would otherwise refuse.
os.environ.setdefault("HPCLAB_ALLOW_LOCAL_ENGINES", "1")

_session = None


def pytest_collection_finish(session):
    """Start 4 MPI engines once if any notebook is to be executed."""
    global _session
    if any(item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid for item in session.items):
        from hpclab import cluster

        _session = cluster.connect(n=int(os.environ.get("HPCLAB_ENGINES", "4")), activate=False)


def pytest_sessionfinish(session, exitstatus):
    if _session is not None:
        _session.close()
