"""Test-session setup: a private IPython profile directory, the simulator, and
(when notebooks are collected) one shared cluster of MPI engines that the notebooks
claim one after another (``hpclab.cluster``: each notebook's connect() claims it,
its session.close() gives it back with an empty namespace)."""
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
# The suite starts engines next to itself even where sbatch is installed and no GPU is (CI, once the
# Slurm tier has installed Slurm): hpclab.cluster.routes.login_node_guard would otherwise refuse.
os.environ.setdefault("HPCLAB_ALLOW_LOCAL_ENGINES", "1")

_shared = None


# -- where a test means something: simulator, GPU, one GPU per rank, ranks sharing one GPU ------
# Markers (registered in pyproject.toml), each skip saying why in pytest's -rs summary:
#   requires_sim(why)           only on the simulator (e.g. simulated device memory is host memory)
#   requires_gpu(why)           only on a real GPU
#   requires_gpu_per_rank(n)    n ranks, each with a GPU of its own (NCCL between them)
#   requires_shared_gpu(n)      n ranks of which some share a GPU (the simulator, or fewer than n GPUs)
def _here() -> tuple[str, int]:
    """(backend this run uses, GPUs the driver reports)."""
    from hpclab import backend

    return backend.select(), backend.count_gpus()


def pytest_collection_modifyitems(config, items):
    import pytest

    kind, gpus = None, 0
    for item in items:
        reasons = []
        for mark in item.iter_markers():
            if not mark.name.startswith("requires_"):
                continue
            if kind is None:
                kind, gpus = _here()
            why = mark.args[0] if mark.args else ""
            if mark.name == "requires_sim" and kind != "sim":
                reasons.append(f"simulator only: {why}")
            elif mark.name == "requires_gpu" and kind != "gpu":
                reasons.append(f"needs a real GPU (this run uses the simulator): {why}")
            elif mark.name == "requires_gpu_per_rank" and (kind != "gpu" or gpus < int(why)):
                reasons.append(f"needs {why} GPUs, one per rank (here: "
                               f"{gpus if kind == 'gpu' else 'the simulator, one simulated device'})")
            elif mark.name == "requires_shared_gpu" and kind == "gpu" and gpus >= int(why):
                reasons.append(f"needs {why} ranks to share a GPU; this machine has {gpus} GPUs, one per rank")
        if reasons:
            item.add_marker(pytest.mark.skip(reason="; ".join(reasons)))


def pytest_collection_finish(session):
    """Start the shared cluster of 4 MPI engines once if any notebook is to be executed."""
    global _shared
    if any(item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid for item in session.items):
        from hpclab import cluster

        _shared = cluster.start_shared(n=int(os.environ.get("HPCLAB_ENGINES", "4")))


def pytest_sessionfinish(session, exitstatus):
    if _shared is not None:
        _shared.stop()


# Every notebook's kernel is started as on a cluster's login node: it sees no GPU and must do no GPU work
# (hpclab.backend.LOGIN_NODE: a kernel launch or a problem size chosen there raises), while the engines,
# started above from this process's environment, have the GPUs. So a cell that would time the simulator on
# a login node, or run a GPU program beside the notebook, fails here, on the simulator and on GPUs alike.
LOGIN_NODE_KERNEL = {"HPCLAB_LOGIN_NODE": "1", "CUDA_VISIBLE_DEVICES": ""}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """nbval starts a notebook's kernel in the setup of its first cell, from os.environ."""
    notebook = item.parent if type(item.parent).__name__ == "IPyNbFile" else None
    if notebook is None or notebook.kernel is not None:
        return (yield)
    saved = {k: os.environ.get(k) for k in LOGIN_NODE_KERNEL}
    os.environ.update(LOGIN_NODE_KERNEL)
    try:
        return (yield)
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """After nbval runs a notebook cell: a cell that makes a figure must show it as an image."""
    result = yield
    outputs = getattr(item, "test_outputs", None)
    cell = getattr(item, "cell", None)
    if outputs is not None and cell is not None and cell.cell_type == "code":
        from hpclab.cli.workbook import missing_image

        why = missing_image(cell.source, outputs)
        if why:
            first = next((ln for ln in cell.source.splitlines() if ln.strip() and not ln.startswith("#")), "")
            pytest.fail(f"{Path(str(item.fspath)).relative_to(ROOT)} code cell {item.cell_num} "
                        f"(nbval's count, the one starting {first[:60]!r}): {why}", pytrace=False)
    return result
