"""Test-session setup: a private IPython profile directory, the simulator, and
(when notebooks are collected) one set of MPI engines shared by all notebooks."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """After nbval runs a notebook cell: a cell that makes a figure must show it as an image."""
    result = yield
    outputs = getattr(item, "test_outputs", None)
    cell = getattr(item, "cell", None)
    if outputs is not None and cell is not None and cell.cell_type == "code":
        from hpclab.workbook import missing_image

        why = missing_image(cell.source, outputs)
        if why:
            first = next((ln for ln in cell.source.splitlines() if ln.strip() and not ln.startswith("#")), "")
            pytest.fail(f"{Path(str(item.fspath)).relative_to(ROOT)} code cell {item.cell_num} "
                        f"(nbval's count, the one starting {first[:60]!r}): {why}", pytrace=False)
    return result
