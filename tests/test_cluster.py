"""MPI engines through ipyparallel: who owns them, starting, stale and dead clusters,
hangs, quiet stops, and how %%px errors read. Each test has its own IPython profile
directory, so its clusters never meet the suite's shared cluster."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import ipyparallel as ipp
import nbformat
import psutil
import pytest

from .helpers import ROOT, env

pytestmark = pytest.mark.notebooks

BROKEN_ENGINE = """
import sys
if "ipyparallel.engine" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    sys.stderr.write("this engine cannot start: libfoo.so missing\\n")
    raise SystemExit(1)
"""

# Executes a notebook with nbclient (a real kernel) and writes it back with its outputs.
# A cell's metadata "timeout" interrupts it after that many seconds, as the stop button does.
RUNNER = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
client = NotebookClient(nb, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                        timeout_func=lambda cell: cell.metadata.get("timeout", 300),
                        resources={"metadata": {"path": sys.argv[3]}})
try:
    client.execute()
finally:
    nbformat.write(nb, sys.argv[2])
"""
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _ipython_env(tmp_path, **extra):
    return env(IPYTHONDIR=str(tmp_path / "ipython"), **extra)


def _profile(tmp_path):
    return tmp_path / "ipython" / "profile_default"


def _notebook(path, *cells, timeouts=None):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in cells])
    for index, seconds in (timeouts or {}).items():
        nb.cells[index].metadata["timeout"] = seconds
    nbformat.write(nb, path)
    return path


def _start_notebook(path, e) -> subprocess.Popen:
    """The runner, its output (and its kernel's) into a file: a pipe that nobody reads while
    another notebook is awaited would fill up and stop the kernel at its next write."""
    out = path.with_suffix(".out.ipynb")
    with open(path.with_suffix(".log"), "wb") as log:
        return subprocess.Popen([sys.executable, "-c", RUNNER, str(path), str(out), str(ROOT)],
                                env=e, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _finish_notebooks(runs: list[tuple[subprocess.Popen, object]], timeout=300) -> list:
    """The executed notebooks of ``runs`` (process, path), waited for together. One still running
    after ``timeout`` s is interrupted (the runner then writes what it has), and the failure shows
    every notebook's outputs so far and the cluster logs: which cell waited, and for what."""
    end = time.monotonic() + timeout
    late = []
    for proc, path in runs:
        try:
            proc.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            late.append(path.name)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    outs = [path.with_suffix(".out.ipynb") for _, path in runs]
    books = [nbformat.read(out, as_version=4) if out.exists() else None for out in outs]
    if late or None in books:   # a notebook that wrote nothing: its runner's log instead
        report = [f"{f'still running after {timeout} s' if path.name in late else 'ended'}: {path.name}\n"
                  + ("\n".join(_text(c) for c in book.cells) if book
                     else path.with_suffix(".log").read_text(errors="replace"))[-3000:]
                  for (_, path), book in zip(runs, books)]
        raise AssertionError("\n\n".join(report + [_cluster_logs(runs[0][1].parent)]))
    return books


def _cluster_logs(tmp_path) -> str:
    """The tails of the test profile's cluster logs (controller, engines, launchers)."""
    logs = sorted((_profile(tmp_path) / "log").glob("*.log"), key=lambda p: p.stat().st_mtime)
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs[-8:])


def _run_notebook(path, e, timeout=300):
    return _finish_notebooks([(_start_notebook(path, e), path)], timeout)[0]


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
        else:
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return ANSI.sub("", "\n".join(parts))


def _errors(cell) -> list:
    return [out for out in cell.get("outputs", []) if out["output_type"] == "error"]


def _hpclab(*args, e, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpclab", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


def _python(code: str, e, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


def _cluster_pids(profile, cluster_id="") -> tuple[list[int], list[int]]:
    """Controller, mpiexec and everything under it (the engines), from the cluster file;
    and the controller's own children (its schedulers)."""
    with open(profile / "security" / f"cluster-{cluster_id}.json") as f:
        raw = json.load(f)
    controller = raw["controller"]["state"]["pid"]
    pids = [controller]
    for engine_set in raw["engines"]["sets"].values():
        pids.append(engine_set["pid"])
        pids += [p.pid for p in psutil.Process(engine_set["pid"]).children(recursive=True)]
    return pids, [p.pid for p in psutil.Process(controller).children(recursive=True)]


def _gone(pids, seconds) -> list[int]:
    """The pids still running (not zombies) after waiting up to ``seconds`` for them to end."""
    end = time.monotonic() + seconds
    while True:
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.5)


@pytest.fixture
def cleanup(tmp_path):
    """Stop whatever a test left in its profile, whatever happened."""
    yield
    _hpclab("cluster", "stop", "--all", e=_ipython_env(tmp_path))


def test_engines_that_cannot_start_fail_within_a_minute_with_their_log(tmp_path, cleanup):
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
    assert "hpclab cluster start" in proc.stdout       # a fix
    assert not list((_profile(tmp_path) / "security").glob("cluster-*.json"))


def _nbval(notebook: str, e: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         "--nbval-cell-timeout=300", "--rootdir", str(ROOT / "notebooks"), str(ROOT / "notebooks" / notebook)],
        capture_output=True, text=True, timeout=600, env=e, cwd=ROOT)


def test_notebook_claims_engines_started_by_ipcluster_and_gives_them_back(tmp_path, cleanup):
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
        client[:].execute("left_behind = 1", block=True)

        proc = _nbval("01_collectives.ipynb", e)
        assert proc.returncode == 0, proc.stdout[-3000:]

        # the engines are still there and still one MPI job, released, their namespace emptied
        assert sorted(client.ids) == ids_before
        ranks = client[:].apply_sync(lambda: __import__("mpi4py.MPI", fromlist=["MPI"]).COMM_WORLD.rank)
        assert sorted(ranks) == [0, 1, 2, 3]
        owners = client[:].apply_sync(lambda: __import__("hpclab.cluster.owner", fromlist=["owner"]).owner())
        assert owners == [None] * 4
        assert client[:].apply_sync(lambda: "left_behind" in globals()) == [False] * 4
        client.close()
    finally:
        subprocess.run(["ipcluster", "stop"], capture_output=True, timeout=60, env=e, cwd=ROOT)


def test_correct_notebook_with_its_own_engines_ends_quietly_and_leaves_nothing_running(tmp_path, cleanup):
    e = _ipython_env(tmp_path)
    src = nbformat.read(ROOT / "notebooks" / "00_setup.ipynb", as_version=4)
    src.cells.insert(5, nbformat.v4.new_code_cell(
        "import json\nprint('ENGINE PIDS', json.dumps(list(session.pids.values())), session.cluster.controller.pid)"))
    nbformat.write(src, tmp_path / "00.ipynb")
    nb = _run_notebook(tmp_path / "00.ipynb", e)
    text = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert not [c for c in nb.cells if c.cell_type == "code" and _errors(c)], text[-3000:]
    assert "starting a private cluster for this notebook" in text
    assert "CRITICAL" not in text and "Traceback" not in text and "Event loop stopped" not in text, text[-3000:]
    assert "stopped this notebook's 4 engines" in text
    pids = re.search(r"ENGINE PIDS (\[.*?\]) (\d+)", text)
    assert not _gone(json.loads(pids.group(1)) + [int(pids.group(2))], 10)
    assert not list((_profile(tmp_path) / "security").glob("cluster-*.json"))


TWO_NOTEBOOKS = '''
import time, pathlib
from hpclab import cluster
flags = pathlib.Path(r"{flags}")
def wait_for(name, seconds=120):
    end = time.time() + seconds
    while not (flags / name).exists():
        assert time.time() < end, f"waited {{seconds}} s for {{name}}"
        time.sleep(0.2)
session = cluster.connect(n=2)
session.deadline(90)   # a %%px cell that hangs fails, with the other notebook's state to read
''', '''
%%px
value = {value} + mpi_rank
''', '''
(flags / "{me}-set").touch()
wait_for("{other}-set")
''', '''
%%px
from mpi4py import MPI
seen = MPI.COMM_WORLD.allgather(value)
''', '''
assert session.view.pull("seen") == [[{value} + r for r in range(session.n)]] * session.n
(flags / "{me}-checked").touch()
'''


def test_two_notebooks_at_once_see_only_their_own_names_and_closing_one_leaves_the_other(tmp_path, cleanup):
    e = _ipython_env(tmp_path)
    start = _hpclab("cluster", "start", "-n", "2", e=e)
    assert start.returncode == 0, start.stdout + start.stderr
    flags = tmp_path / "flags"
    flags.mkdir()
    fmt = dict(flags=flags)
    first = [c.format(me="A", other="B", value=100, **fmt) for c in TWO_NOTEBOOKS] + [
        'wait_for("B-checked")\nsession.close()\n(flags / "A-closed").touch()']
    second = [c.format(me="B", other="A", value=200, **fmt) for c in TWO_NOTEBOOKS] + [
        'wait_for("A-closed")', TWO_NOTEBOOKS[3], TWO_NOTEBOOKS[4].format(me="B", value=200, **fmt),
        "session.close()"]
    # a connect() that stalls is interrupted, its traceback saying where (px cells have their deadline)
    paths = [_notebook(tmp_path / f"{name}.ipynb", *cells, timeouts={0: 120})
             for name, cells in (("A", first), ("B", second))]
    books = _finish_notebooks([(_start_notebook(path, e), path) for path in paths], timeout=600)
    texts = ["\n".join(_text(c) for c in nb.cells) for nb in books]
    # an error in one notebook may come from the other: show both
    assert not [c for nb in books for c in nb.cells if _errors(c)], \
        "\n\n".join([f"{name}:\n{text[-3000:]}" for name, text in zip("AB", texts)] + [_cluster_logs(tmp_path)])
    # exactly one claimed the shared cluster; the other was told why it got engines of its own
    claimed = [t for t in texts if "claimed the shared cluster" in t]
    private = [t for t in texts if "is in use by the notebook with kernel pid" in t
               and "starting a private cluster for this notebook" in t]
    assert len(claimed) == 1 and len(private) == 1, texts
    status = _hpclab("cluster", "status", e=e)
    assert "shared cluster (id ''): 2 of 2 engines up; free" in status.stdout, status.stdout


KILL_ONE_ENGINE = '''
import os, signal, time
from hpclab import cluster
session = cluster.connect(n=2)
os.kill(session.pids[session.view.targets[1]], signal.SIGKILL)     # rank 1
time.sleep(0.5)
session = cluster.connect(n=2)
assert session.on_ranks(lambda: __import__("mpi4py.MPI", fromlist=["MPI"]).COMM_WORLD.allreduce(1)) == [2, 2]
print("WORKS", session.kind)
session.close()
'''


# What the message can say of the killed rank 1: Open MPI names it ("rank 1 (pid N) died"); where MPI is
# still ending the job when connect() looks, rank 1 is the missing engine; MPICH names no rank, and the first
# engine the controller heard was gone may be either (MPICH ends the others at once).
GONE = r"(1 \(pid \d+\) died|1 has stopped|[01] was the first reported gone)"


def test_killed_engine_is_replaced_with_a_message_saying_what_died(tmp_path, cleanup):
    e = _ipython_env(tmp_path)
    # a private cluster: connect() replaces it and says what it replaced
    proc = _python(KILL_ONE_ENGINE, e)
    assert "WORKS private" in proc.stdout, proc.stdout + proc.stderr
    assert re.search(r"replacing this notebook's private cluster hpclab-\S+: rank " + GONE,
                     proc.stdout), proc.stdout
    # the shared cluster: connect() says which rank died and starts a private cluster instead
    assert _hpclab("cluster", "start", "-n", "2", e=e).returncode == 0
    proc = _python(KILL_ONE_ENGINE, e)
    assert "WORKS private" in proc.stdout, proc.stdout + proc.stderr
    assert "claimed the shared cluster" in proc.stdout
    assert re.search(r"(the shared cluster of profile 'default' cannot be used|replacing this notebook's shared "
                     r"cluster): rank " + GONE, proc.stdout), proc.stdout
    assert "starting a private cluster for this notebook instead" in proc.stdout


def test_stale_cluster_files_are_removed_and_connect_works_at_the_first_try(tmp_path, cleanup):
    e = _ipython_env(tmp_path)
    assert _hpclab("cluster", "start", "-n", "2", e=e).returncode == 0
    pids, schedulers = _cluster_pids(_profile(tmp_path))
    for pid in pids:  # the controller's schedulers are left, as when the controller alone is killed
        os.kill(pid, signal.SIGKILL)
    assert not _gone(pids, 10)
    stale = _profile(tmp_path) / "security" / "cluster-.json"
    assert stale.exists()
    proc = _python("""
        from hpclab import cluster
        session = cluster.connect(n=2, timeout=60)
        print("RANKS", session.ranks)
        session.close()
        """, e)
    assert "RANKS [0, 1]" in proc.stdout, proc.stdout + proc.stderr
    assert f"removed the stale cluster file {stale}: its controller (pid {pids[0]}) is no longer running" \
        in proc.stdout, proc.stdout
    assert schedulers and not _gone(schedulers, 5), "the dead controller's schedulers were left running"


def test_engines_end_with_the_kernel_that_started_them(tmp_path, cleanup):
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=_ipython_env(tmp_path), cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        out = []
        kc.execute_interactive(
            "import os, json\nfrom hpclab import cluster\nsession = cluster.connect(n=2)\n"
            "print('PIDS', json.dumps([os.getpid(), session.cluster.controller.pid, "
            "session.cluster.engine_set.pid, *session.pids.values()]))",
            timeout=180, output_hook=lambda msg: out.append(msg["content"].get("text", "")))
        found = re.search(r"PIDS (\[.*?\])", "".join(out))
        assert found, "".join(out)
        kernel, *cluster_pids = json.loads(found.group(1))
        os.kill(kernel, signal.SIGKILL)
        t0 = time.monotonic()
        assert not _gone(cluster_pids, 30), "the kernel's engines outlived it"
        assert time.monotonic() - t0 < 30
        # the reaper removes the cluster file after the processes have ended: give it those moments
        end = time.monotonic() + 10
        while list((_profile(tmp_path) / "security").glob("cluster-*.json")) and time.monotonic() < end:
            time.sleep(0.2)
        assert not list((_profile(tmp_path) / "security").glob("cluster-*.json"))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_px_errors_read_once_and_a_deadlock_is_recovered_by_restart(tmp_path, cleanup):
    e = _ipython_env(tmp_path)
    stub = 'raise NotImplementedError("exercise: write this part (see the instructions above)")'
    path = _notebook(
        tmp_path / "px.ipynb",
        "from hpclab import cluster\nsession = cluster.connect(n=2)",           # 0
        f"%%px\ndef my_part(x):\n    {stub}",                                   # 1
        "%%px\nresult = my_part(1)",                                           # 2: the stub, on both ranks
        "%%px\nprint(result)",                                                 # 3: NameError
        """
        %%px
        import numpy as np
        from mpi4py import MPI
        buf = np.zeros(1)
        MPI.COMM_WORLD.Recv(buf, source=1 - MPI.COMM_WORLD.rank)   # both ranks wait: no Send comes
        """,                                                                   # 4: interrupted (stop button)
        "session.deadline(2)",                                                 # 5
        "%%px\nafter = 1",                                                     # 6: queued behind 4: the deadline
        "session.restart()",                                                   # 7
        """
        %%px
        from mpi4py import MPI
        total = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank + 1)
        """,                                                                   # 8
        'assert session.view.pull("total") == [3, 3]\nsession.close()',       # 9
        timeouts={4: 6, 6: 30})
    cells = _run_notebook(path, e, timeout=300).cells
    # the unfilled stub: one message for both ranks, pointing at the cell that defines it
    [error] = _errors(cells[2])
    message = _text(cells[2])
    assert message.count("NotImplementedError on all 2 ranks: exercise: write this part") == 1, message
    assert f"in cell [{cells[1].execution_count}] (where `my_part` is defined)" in message, message
    assert "Traceback" not in message
    # the later cell names the earlier failed one
    assert f"`result` would have been defined by cell [{cells[2].execution_count}], which failed" \
        in _text(cells[3]), _text(cells[3])
    assert _text(cells[3]).count("NameError: name 'result' is not defined") == 1
    # a hung cell, interrupted by the stop button or by the deadline, says what to do
    for hung in (4, 6):
        assert "session.restart()" in _text(cells[hung]), _text(cells[hung])
        assert "Recv whose matching Send never comes" in _text(cells[hung])
    assert "ran past the deadline of 2 s" in _text(cells[6])
    # restart recovers within a minute of the hang; a collective works again
    assert "restarted in" in _text(cells[7]), _text(cells[7])
    assert not _errors(cells[7]) and not _errors(cells[8]) and not _errors(cells[9]), _text(cells[9])
    seconds = _iso(cells[9].metadata.execution["shell.execute_reply"]) - \
        _iso(cells[4].metadata.execution["iopub.execute_input"])
    assert seconds < 60, f"from the hang to a working collective took {seconds:.0f} s"


def _iso(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_restart_of_a_hung_shared_cluster_starts_its_engines_again_and_keeps_the_claim(tmp_path, cleanup):
    e = _ipython_env(tmp_path)
    assert _hpclab("cluster", "start", "-n", "2", e=e).returncode == 0
    proc = _python("""
        import time
        from hpclab import cluster
        session = cluster.connect(n=2)
        hung = session.view.execute("import numpy as np\\nfrom mpi4py import MPI\\n"
                                    "MPI.COMM_WORLD.Recv(np.zeros(1), source=1 - MPI.COMM_WORLD.rank)", block=False)
        time.sleep(1)
        assert not hung.ready()
        session.restart()
        print("AFTER", session.kind, session.on_ranks(lambda: __import__("mpi4py.MPI", fromlist=["MPI"]).COMM_WORLD.allreduce(1)))
        session.close()
        """, e)
    assert "AFTER shared [2, 2]" in proc.stdout, proc.stdout + proc.stderr
    assert "restarted in" in proc.stdout
    status = _hpclab("cluster", "status", e=e)
    assert "shared cluster (id ''): 2 of 2 engines up; free" in status.stdout, status.stdout


@pytest.mark.parametrize("n", [1, 3])
def test_clusters_of_one_or_three_engines_start_claim_and_give_back(tmp_path, cleanup, n):
    """A private cluster of n engines, then the profile's shared cluster of n engines claimed by a notebook's
    connect() (whose claim once failed on an empty view of the engines after rank 0 when n was 1)."""
    e = _ipython_env(tmp_path)
    size = "lambda: __import__('mpi4py.MPI', fromlist=['MPI']).COMM_WORLD.size"
    proc = _python(f"""
        from hpclab import cluster
        s = cluster.connect(n={n})
        print("PRIVATE", s.kind, s.n, s.ranks, s.on_ranks({size}))
        s.close()
    """, e)
    assert f"PRIVATE private {n} {list(range(n))} {[n] * n}" in proc.stdout, proc.stdout + proc.stderr
    start = _hpclab("cluster", "start", "-n", str(n), e=e)
    assert start.returncode == 0, start.stdout + start.stderr
    proc = _python(f"""
        from hpclab import cluster
        s = cluster.connect(n={n})
        print("SHARED", s.kind, s.n, s.ranks, s.on_ranks({size}))
        s.close()
        s = cluster.connect(n={n})      # the next notebook claims it again
        print("AGAIN", s.kind, s.n)
        s.close()
    """, e)
    said = proc.stdout + proc.stderr
    assert f"SHARED shared {n} {list(range(n))} {[n] * n}" in said and f"AGAIN shared {n}" in said, said
    assert "Traceback" not in said, said


def test_a_notebook_runs_on_a_shared_cluster_of_one_engine(tmp_path, cleanup):
    e = _ipython_env(tmp_path)
    assert _hpclab("cluster", "start", "-n", "1", e=e).returncode == 0
    proc = _nbval("00_setup.ipynb", e)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_shared_engines_job_is_not_idle_while_its_starter_waits_for_the_engines(tmp_path):
    """The idle clock of the shared engines job starts when nobody holds it: not while the process that submitted
    it still waits for its engines (the job's queue and start-up), and as soon as that process is gone."""
    from hpclab.cluster import files, reaper

    pdir, cid = str(tmp_path), files.SHARED_ID
    (tmp_path / "security").mkdir()
    (tmp_path / "security" / os.path.basename(files.cluster_file(pdir, cid))).write_text(json.dumps({"engines": {}}))
    files.write_record(pdir, cid, {"owner": None, "starting": files.this_process()})
    idle: list[float] = []
    assert reaper._why_end(pdir, cid, ["--idle", "0"], idle) is None and idle == []
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    files.write_record(pdir, cid, {"owner": None, "starting": {**files.this_process(), "pid": gone.pid}})
    time.sleep(0.01)
    assert reaper._why_end(pdir, cid, ["--idle", "0"], idle) == "no notebook used it for 0 min"


def test_waiting_for_processes_to_end_returns_those_still_running_and_ends_with_the_last():
    from hpclab.cluster import files
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        processes = [psutil.Process(quick.pid), psutil.Process(slow.pid)]
        t0 = time.monotonic()
        assert files.wait_gone(processes, timeout=1.0) == processes[1:]   # the quick one ended (a zombie here)
        assert 1.0 <= time.monotonic() - t0 < 5
        slow.kill()
        t0 = time.monotonic()
        assert files.wait_gone(processes, timeout=30) == [] and time.monotonic() - t0 < 5
        quick.wait(), slow.wait()
        assert files.wait_gone(processes, timeout=30) == []                # reaped: no such process any more
    finally:
        slow.kill()
        quick.wait(), slow.wait()
