"""MPI engines through ipyparallel: start, reuse, order by rank, fail clearly."""
import os
import subprocess
import sys
import time

import ipyparallel as ipp
import pytest

from .helpers import ROOT, env

pytestmark = pytest.mark.notebooks

BROKEN_ENGINE = """
import sys
if "ipyparallel.engine" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    sys.stderr.write("this engine cannot start: libfoo.so missing\\n")
    raise SystemExit(1)
"""


def _ipython_env(tmp_path, **extra):
    return env(IPYTHONDIR=str(tmp_path / "ipython"), **extra)


def test_engines_that_cannot_start_fail_within_a_minute_with_their_log(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BROKEN_ENGINE)
    e = _ipython_env(tmp_path)
    e["PYTHONPATH"] = f"{site}{os.pathsep}{e['PYTHONPATH']}"
    code = ("from hpclab import cluster\n"
            "try:\n    cluster.connect(n=2, timeout=45)\n"
            "except cluster.ClusterError as exc:\n    print('CLUSTER ERROR', exc)\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=e, cwd=ROOT)
    assert time.monotonic() - t0 < 75
    assert "CLUSTER ERROR 2 MPI engines did not start" in proc.stdout, proc.stdout + proc.stderr
    assert "libfoo.so missing" in proc.stdout          # the tail of the engine log
    assert "ipcluster start --engines=MPI" in proc.stdout


def _nbval(notebook: str, e: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         "--nbval-cell-timeout=300", "--rootdir", str(ROOT / "notebooks"), str(ROOT / "notebooks" / notebook)],
        capture_output=True, text=True, timeout=600, env=e, cwd=ROOT)


def test_notebook_uses_engines_started_by_ipcluster_and_leaves_them_running(tmp_path):
    e = _ipython_env(tmp_path)
    start = subprocess.run(["ipcluster", "start", "--engines=MPI", "-n", "4", "--daemonize"],
                           capture_output=True, text=True, timeout=60, env=e, cwd=ROOT)
    assert start.returncode == 0, start.stderr
    try:
        client = None
        deadline = time.monotonic() + 60
        while client is None and time.monotonic() < deadline:
            try:
                client = ipp.Client(profile="default", ipython_dir=e["IPYTHONDIR"], timeout=5)
            except (OSError, TimeoutError):
                time.sleep(1)
        assert client is not None, "ipcluster did not come up"
        client.wait_for_engines(4, timeout=60)
        ids_before = sorted(client.ids)

        proc = _nbval("01_collectives.ipynb", e)
        assert proc.returncode == 0, proc.stdout[-3000:]

        # the engines are still there and still answer, as one MPI job
        assert sorted(client.ids) == ids_before
        ranks = client[:].apply_sync(lambda: __import__("mpi4py.MPI", fromlist=["MPI"]).COMM_WORLD.rank)
        assert sorted(ranks) == [0, 1, 2, 3]
        client.close()
    finally:
        subprocess.run(["ipcluster", "stop"], capture_output=True, timeout=60, env=e, cwd=ROOT)


def test_notebook_starts_its_own_engines_and_stops_them(tmp_path):
    e = _ipython_env(tmp_path)
    proc = _nbval("00_setup.ipynb", e)
    assert proc.returncode == 0, proc.stdout[-3000:]
    # nothing left running in that profile
    with pytest.raises((OSError, FileNotFoundError, TimeoutError, ValueError)):
        ipp.Cluster.from_file(profile_dir=str(tmp_path / "ipython" / "profile_default"), cluster_id="")
