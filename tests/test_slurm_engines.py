"""The Slurm tier, part two: a notebook's engines from Slurm through connect(), as a learner meets them: one
engines job shared by the notebooks of a day, its idle period, its restart, a job that is broken, queued or cut off
from the controller, a notebook inside an allocation, Slurm ending the job during a cell (cancel, time limit, node
lost), and the Open OnDemand app's script as a job. Its own two-node Slurm (tests/slurm_local.py), beside the one of
tests/test_slurm.py, so that the two files run side by side in `make test`.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
import yaml

from .helpers import ROOT
from .test_slurm import (completed, connect_in, hpclab_in, init_profile, job_env, no_jobs_left,
                         stale_cluster_file)
from .test_slurm import no_job_outlives_its_test, slurm  # noqa: F401 - fixtures: this file's own Slurm

pytestmark = pytest.mark.slurm


# ---------------------------------------------------------------- connect() with engines from Slurm

TINY = ["from hpclab import cluster\nsession = cluster.connect(n=4, timeout=240)",
        "%%px\nfrom mpi4py import MPI\nassert MPI.COMM_WORLD.allreduce(1) == 4",
        "import os\nprint('JOB', session.job, os.getpid())\nsession.close()"]


def test_eight_notebooks_in_a_row_on_a_slurm_profile_use_one_engines_job(slurm, tmp_path):
    init_profile(slurm, tmp_path)
    books = []
    for k in range(8):
        path = tmp_path / f"nb{k}.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in TINY]), path)
        books.append(str(path))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-cell-timeout=300",
           "--rootdir", str(tmp_path), *books]
    proc = slurm.run(cmd, env=job_env(slurm, tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    jobs = slurm.jobs()
    assert len(jobs) == 1, jobs  # the first notebook started it; it outlives them all
    job = jobs[0]
    assert slurm.job(job)["JobName"] == "hpclab-engines" and slurm.job(job)["JobState"] == "RUNNING"
    status = hpclab_in(slurm, tmp_path, "cluster", "status")
    assert re.search(rf"shared cluster \(id ''\): 4 of 4 engines up; free; Slurm job {job} \(hpclab-engines\) RUNNING "
                     r"on node1 for \S+; log: \S+ \(0:(0\d|10) left\)", status.stdout), status.stdout
    # while a notebook holds it, status says who
    with open(tmp_path / "holder.out", "w") as out:
        holder = slurm.popen([sys.executable, "-c", "import time\nfrom hpclab import cluster\ns = cluster.connect(n=4)\n"
                              "print('HELD', flush=True)\ntime.sleep(120)"], env=job_env(slurm, tmp_path), cwd=ROOT,
                             stdout=out, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while "HELD" not in (tmp_path / "holder.out").read_text() and holder.poll() is None and time.monotonic() < end:
            time.sleep(0.5)
        assert "claimed the shared cluster" in (tmp_path / "holder.out").read_text()
        status = hpclab_in(slurm, tmp_path, "cluster", "status")
        assert f"claimed by the notebook with kernel pid {holder.pid} on" in status.stdout, status.stdout
    finally:
        holder.kill()
        holder.wait()
    stop = hpclab_in(slurm, tmp_path, "cluster", "stop")  # what `make stop` runs
    assert stop.returncode == 0 and f"stopped the shared cluster (cancelled Slurm job {job})" in stop.stdout, stop.stdout
    assert slurm.wait(job, timeout=60)["JobState"] == "CANCELLED"  # not FAILED: stopped, not broken


def cluster_files_gone(tmp_path, within: float = 30) -> bool:
    """The watcher cancels the job first, then stops the controller and removes its file: wait for that."""
    sec = tmp_path / "ipython" / "profile_default" / "security"
    end = time.monotonic() + within
    while list(sec.glob("cluster-*.json")) and time.monotonic() < end:
        time.sleep(1)
    return not list(sec.glob("cluster-*.json"))


def test_when_slurm_ends_the_engines_job_its_controller_stops_and_the_next_notebook_gets_a_new_job(slurm, tmp_path):
    """As at the job's time limit: here scancel ends it, sooner."""
    init_profile(slurm, tmp_path)
    code = "s = cluster.connect(n=4, timeout=120)\nprint('JOB', s.job)\ns.close()\n"
    first = re.search(r"^JOB (\d+)", connect_in(slurm, tmp_path, code).stdout, re.M).group(1)
    slurm.run(["scancel", first])
    assert cluster_files_gone(tmp_path), "the controller of an ended engines job was left running"
    proc = connect_in(slurm, tmp_path, code)
    second = re.search(r"^JOB (\d+)", proc.stdout, re.M)
    assert second and second.group(1) != first and slurm.jobs() == [second.group(1)], proc.stdout + proc.stderr
    hpclab_in(slurm, tmp_path, "cluster", "stop")


def test_the_shared_engines_job_ends_after_its_idle_period(slurm, tmp_path):
    init_profile(slurm, tmp_path, "--idle", "1")
    profile = tmp_path / "ipython" / "profile_default" / "hpclab_slurm.json"
    profile.write_text(profile.read_text().replace('"idle": 1', '"idle": 0.25'))  # 15 s, for the test's sake
    proc = connect_in(slurm, tmp_path, "s = cluster.connect(n=4, timeout=120)\nprint('JOB', s.job)\ns.close()\n")
    job = re.search(r"^JOB (\d+)", proc.stdout, re.M)
    assert job, proc.stdout + proc.stderr
    assert "after 0.25 min without a notebook" in proc.stdout
    info = slurm.wait(job.group(1), timeout=90)
    assert info["JobState"] == "CANCELLED", completed(info)
    assert cluster_files_gone(tmp_path), "the idle job's controller was left running"


def test_connect_with_a_broken_engine_job_names_job_and_log_within_its_deadline(slurm, tmp_path):
    init_profile(slurm, tmp_path, "--mpi", "pmix")
    t0 = time.monotonic()
    proc = connect_in(slurm, tmp_path, "try:\n    cluster.connect(n=4, timeout=90)\n"
                                       "except cluster.ClusterError as exc:\n    print('ERROR', exc)\n")
    assert time.monotonic() - t0 < 150
    found = re.search(r"ERROR .*Slurm job \d+ \(hpclab-engines\) FAILED.* Log: (\S+)", proc.stdout)
    assert found, proc.stdout + proc.stderr
    assert "/profile_default/log/" in found.group(1) and Path(found.group(1)).exists()  # the log is kept
    assert "pmi2" in proc.stdout
    before = proc.stdout.split("ERROR")[0]  # nothing started locally: the engines were only ever a job
    assert "4 engines as one Slurm job" in before and "on this machine" not in before and "started" not in before
    assert no_jobs_left(slurm)


def test_connect_on_a_login_node_does_not_start_local_engines(slurm, tmp_path):
    e = job_env(slurm, tmp_path)
    e.pop("HPCLAB_ALLOW_LOCAL_ENGINES")
    proc = slurm.run([sys.executable, "-c", "from hpclab import cluster\ntry:\n    cluster.connect(n=2, timeout=30)\n"
                      "except cluster.ClusterError as exc:\n    print('ERROR', exc)\n"], env=e, timeout=120, cwd=ROOT)
    assert "ERROR" in proc.stdout and "hpclab cluster init --slurm" in proc.stdout, proc.stdout + proc.stderr


def test_connect_with_a_job_still_queued_at_its_deadline_cancels_it_and_says_why(slurm, tmp_path):
    stale = stale_cluster_file(tmp_path / "ipython" / "profile_default", "987654")
    init_profile(slurm, tmp_path)
    hog = slurm.sbatch(["--gres=gpu:8", "-n", "1", f"--output={tmp_path}/hog.out", "--wrap", "sleep 600"],
                       env=job_env(slurm, tmp_path), cwd=tmp_path)
    try:
        t0 = time.monotonic()
        proc = connect_in(slurm, tmp_path, "try:\n    cluster.connect(n=4, timeout=15)\n"
                                           "except cluster.ClusterError as exc:\n    print('ERROR', exc)\n")
        assert time.monotonic() - t0 < 60
        said = proc.stdout + proc.stderr
        assert f"removed the stale cluster file {stale}: its controller (pid 4242424) is no longer running" in said, said
        assert re.search(r"ERROR 4 engines did not start: only 0 of 4 engines registered in 15 s; Slurm job \d+ "
                         r"\(hpclab-engines\) PENDING \(Resources\): waiting for free GPUs", said), said
        assert "profile_default/log/" in said and "The job is cancelled now" in said, said
        assert slurm.jobs() == [hog]
    finally:
        slurm.run(["scancel", hog])


GPU_OF_RANK = ("lambda: (__import__('hpclab.device').device.local_rank()[0], "
               "len(__import__('os').environ['CUDA_VISIBLE_DEVICES'].split(',')))")


def test_restart_of_the_engines_job_submits_a_new_one_that_stays_for_the_next_notebook(slurm, tmp_path):
    init_profile(slurm, tmp_path)
    proc = connect_in(slurm, tmp_path, "s = cluster.connect(n=4, timeout=120)\nprint('JOB', s.job)\ns.restart()\n"
                                       f"print('JOB', s.job, s.on_ranks({GPU_OF_RANK}))\ns.close()\n")
    jobs = re.findall(r"^JOB (\d+)", proc.stdout, re.MULTILINE)
    assert proc.returncode == 0 and len(set(jobs)) == 2, proc.stdout + proc.stderr
    assert f"restarting: cancelling Slurm job {jobs[0]}" in proc.stdout
    # rank r has node-local rank r and sees the job's 4 GPUs: GPU local_rank % 4, one per rank
    assert f"JOB {jobs[1]} [(0, 4), (1, 4), (2, 4), (3, 4)]" in proc.stdout, proc.stdout
    assert "released the shared cluster's 4 engines" in proc.stdout
    assert slurm.jobs() == [jobs[1]] and slurm.job(jobs[0])["JobState"] in ("CANCELLED", "FAILED")
    assert "stopped the shared cluster" in hpclab_in(slurm, tmp_path, "cluster", "stop").stdout
    assert no_jobs_left(slurm)


def test_engines_that_cannot_reach_the_controller_name_the_route_inside_an_allocation(slurm, tmp_path):
    """The controller where the notebook runs, unreachable from the nodes: here at the loopback address of the
    login side, which the engines on node2 (partition far) try on their own loopback instead."""
    proc = hpclab_in(slurm, tmp_path, "cluster", "init", "--slurm", "--partition", "far", "--gpus-per-node", "4",
                     "--controller-location", "127.0.0.1")
    assert proc.returncode == 0, proc.stderr
    t0 = time.monotonic()
    proc = connect_in(slurm, tmp_path, "try:\n    cluster.connect(n=4, timeout=120)\n"
                                       "except cluster.ClusterError as exc:\n    print('ERROR', exc)\n")
    assert time.monotonic() - t0 < 90
    said = proc.stdout + proc.stderr
    assert re.search(r"ERROR 4 engines did not start: Slurm job \d+ \(hpclab-engines\) FAILED .*could not reach the "
                     r"controller.* Fix: run JupyterLab inside an allocation", said), said
    assert no_jobs_left(slurm)


INSIDE = """#!/bin/bash
#SBATCH --ntasks=4
#SBATCH --gpus-per-node=4
#SBATCH --job-name=lab
cd {root}
exec {step}{python} -c "$RUNNER" {nb} {out} {root}
"""
IN_JOB = ["from hpclab import cluster\nsession = cluster.connect(n=4, timeout=120)",
          "%%px\nimport os\nfrom mpi4py import MPI\n"
          "where = (MPI.COMM_WORLD.rank, os.environ['SLURM_JOB_ID'], os.environ.get('SLURM_STEP_ID'), "
          "os.environ['CUDA_VISIBLE_DEVICES'])",
          "print('ENGINES', session.view.pull('where'))\nsession.close()"]


@pytest.mark.parametrize("step", ["", "srun --overlap -n 1 --pty "], ids=["in-the-batch-step", "in-an-srun-step"])
def test_a_notebook_inside_an_allocation_runs_on_engines_of_that_job(slurm, tmp_path, step):
    """JupyterLab inside a job: in its batch script (Open OnDemand) or in a step of it (salloc, then
    srun --pty bash, then make lab). connect() starts another srun step in it."""
    from .test_cluster import RUNNER

    init_profile(slurm, tmp_path)  # a Slurm profile too: still no second job
    nb, out = tmp_path / "in_job.ipynb", tmp_path / "in_job.out.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in IN_JOB]), nb)
    script = tmp_path / "lab.sbatch"
    script.write_text(INSIDE.format(root=ROOT, python=sys.executable, nb=nb, out=out, step=step))
    known = set(re.findall(r"JobId=(\d+)", slurm.run(["scontrol", "show", "job", "-o"], timeout=20).stdout))
    job = slurm.sbatch([f"--output={tmp_path}/lab.out", str(script)], env=job_env(slurm, tmp_path, RUNNER=RUNNER),
                       cwd=tmp_path)
    info = slurm.wait(job, timeout=300)
    log = (tmp_path / "lab.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and out.exists(), f"{completed(info)}\n{log[-3000:]}"
    text = "\n".join(o.get("text", "") for c in nbformat.read(out, as_version=4).cells for o in c.get("outputs", []))
    assert f"4 MPI engines in this Slurm job {job} (srun --mpi=pmi2 --kill-on-bad-exit=1 --overlap -n 4, one rank " \
           "per GPU); " \
           "no second job" in text, text
    engines = eval(re.search(r"ENGINES (\[.*\])", text).group(1))  # noqa: S307 - our own notebook's output
    assert [e[:2] for e in engines] == [(r, job) for r in range(4)], engines
    assert len({e[2] for e in engines}) == 1 and engines[0][2] is not None, engines  # one srun step of that job
    assert {e[3] for e in engines} == {"0,1,2,3"}, engines                           # the job's GPUs
    ever = set(re.findall(r"JobId=(\d+)", slurm.run(["scontrol", "show", "job", "-o"], timeout=20).stdout))
    assert ever - known == {job}, ever - known                                      # no second job


# ---------------------------------------------------------------- Slurm ending the engines job during a %%px cell

FAULT_CELLS = [
    "import pathlib, time\nfrom hpclab import cluster\nsession = cluster.connect(n=4, timeout=240)\n"
    "pathlib.Path({marker!r}).write_text(session.job)",
    "%%px\nimport time\ntime.sleep(150)",
    "import time\nprint('AFTER', time.time())",
    "session.restart()\nprint('JOB', session.job)",
    "%%px\nfrom mpi4py import MPI\nsize = MPI.COMM_WORLD.allreduce(1)",
    "assert session.view.pull('size') == [4] * 4\nprint('SIZES OK')\nsession.close()",
]


def run_through_a_fault(slurm, tmp_path, inject) -> tuple[str, float, float, list]:
    """Run the notebook above on a Slurm profile; once its long %%px cell runs, ``inject(job)`` ends the engines
    job. (the job, the seconds from the fault and from Slurm's saying the job ended until the cell had ended, the
    notebook's cells' texts)."""
    from .test_cluster import RUNNER, _text

    init_profile(slurm, tmp_path)
    marker, mine = tmp_path / "job", tmp_path / "my-work"
    mine.mkdir()
    (mine / "01_collectives.ipynb").write_text("the learner's own work")
    nb, out = tmp_path / "fault.ipynb", tmp_path / "fault.out.ipynb"
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.format(marker=str(marker))) for c in FAULT_CELLS])
    book.cells[1].metadata["timeout"] = 240
    nbformat.write(book, nb)
    runner = slurm.popen([sys.executable, "-c", RUNNER, str(nb), str(out), str(mine)], env=job_env(slurm, tmp_path),
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 240
        while not marker.exists() and runner.poll() is None and time.monotonic() < end:
            time.sleep(0.5)
        assert marker.exists(), f"the notebook got no engines; {slurm.log('slurmctld')}"
        job = marker.read_text()
        time.sleep(6)                                   # the long cell is running now
        faulted = time.time()
        inject(job)
        while slurm.job(job).get("JobState") in ("RUNNING", "COMPLETING") and runner.poll() is None:
            time.sleep(0.5)
        ended = time.time()
        runner.wait(timeout=400)
    finally:
        if runner.poll() is None:
            runner.kill()
    texts = [_text(c) for c in nbformat.read(out, as_version=4).cells]
    after = float(re.search(r"AFTER (\S+)", texts[2]).group(1))
    assert (mine / "01_collectives.ipynb").read_text() == "the learner's own work"
    assert [p.name for p in mine.iterdir()] == ["01_collectives.ipynb"]
    return job, after - faulted, after - ended, texts


def assert_one_message_then_a_fresh_job(slurm, tmp_path, job: str, texts: list[str], state: str) -> None:
    message = texts[1]
    print(message)
    assert message.count(f"Slurm job {job}") == 1 and state in message, message
    assert "session.restart()" in message and "Engine " not in message and "rank None" not in message, message
    assert message.count("Traceback") <= 1, message
    new = re.search(r"^JOB (\d+)", texts[3], re.M)
    assert new and new.group(1) != job and "SIZES OK" in texts[5], texts[3:]
    assert "stopped the shared cluster" in hpclab_in(slurm, tmp_path, "cluster", "stop").stdout or not slurm.jobs()
    assert no_jobs_left(slurm)
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or ()) and "ipyparallel" in " ".join(p.info["cmdline"] or ())]
    assert not left, left


def test_engines_job_cancelled_during_a_cell_ends_it_with_one_message_and_restart_goes_on(slurm, tmp_path):
    job, seconds, _, texts = run_through_a_fault(slurm, tmp_path, lambda job: slurm.run(["scancel", job]))
    assert seconds < 20, (seconds, texts[1])
    assert_one_message_then_a_fresh_job(slurm, tmp_path, job, texts, "CANCELLED")


def test_engines_job_reaching_its_time_limit_during_a_cell_ends_it_with_one_message(slurm, tmp_path):
    def time_limit(job):   # as if its --time had been short: its limit is now already past
        proc = slurm.run(["scontrol", "update", f"JobId={job}", "TimeLimit=0:01"])
        assert proc.returncode == 0, proc.stderr

    job, _, seconds, texts = run_through_a_fault(slurm, tmp_path, time_limit)
    assert seconds < 20, (seconds, texts[1])        # after Slurm ended it (it checks time limits once a minute)
    assert_one_message_then_a_fresh_job(slurm, tmp_path, job, texts, "TIMEOUT")


def test_engines_node_lost_during_a_cell_ends_it_with_one_message(slurm, tmp_path):
    def lose(job):
        slurm.lose_node1()
        threading.Timer(45, slurm.restore_node1).start()   # the node comes back for the restart's new job

    job, seconds, _, texts = run_through_a_fault(slurm, tmp_path, lose)
    assert seconds < 60, (seconds, texts[1])
    assert_one_message_then_a_fresh_job(slurm, tmp_path, job, texts, "NODE_FAIL")


# ---------------------------------------------------------------- the Open OnDemand app, as a job

OOD_JOB = """#!/bin/bash
{native}
#SBATCH --partition=gpu
#SBATCH --time=00:10:00
#SBATCH --job-name=ood-hpclab
# What Open OnDemand's basic template wraps around the app's scripts: the host, its helpers, before.sh, script.sh.
export host=$(hostname)
find_port() {{ "{python}" -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"; }}
create_passwd() {{ tr -dc 'a-zA-Z0-9' < /dev/urandom | head -c "$1"; }}
source {before}
# script.sh execs JupyterLab; here in the background, so that this job can also run a notebook beside it
bash {script} > {tmp}/lab.log 2>&1 &
for i in $(seq 1 120); do
    curl -sf -H "Authorization: token $password" "http://127.0.0.1:$port/node/$host/$port/api/status" && break
    sleep 0.5
done
echo
echo "LAB $(curl -s -o /dev/null -w '%{{http_code}}' -H "Authorization: token $password" "http://127.0.0.1:$port/node/$host/$port/api/contents/notebooks")"
"{python}" -c "$RUNNER" {nb} {out} {root}
kill %1
"""


def test_the_ood_apps_script_serves_jupyterlab_in_its_job_and_a_notebook_gets_engines_there(slurm, tmp_path):
    from .test_cluster import RUNNER
    from .test_ood import FORM, render

    form = {**FORM, "gpus": "2", "reservation": "", "workbook": str(ROOT), "setup": ""}
    native = yaml.safe_load(render("submit.yml.erb", form))["script"]["native"]
    (tmp_path / "before.sh").write_text(render("template/before.sh.erb", form))
    (tmp_path / "script.sh").write_text(render("template/script.sh.erb", form))
    config = tmp_path / "jupyter"
    config.mkdir()
    (config / "jupyter_server_config.py").write_text("c.ServerApp.allow_root = True\n")   # (the tests run as root)
    nb, out = tmp_path / "in_job.ipynb", tmp_path / "in_job.out.ipynb"
    cells = [IN_JOB[0].replace("n=4", "n=2"), IN_JOB[1], IN_JOB[2]]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), nb)
    job_script = tmp_path / "ood.sbatch"
    job_script.write_text(OOD_JOB.format(native="\n".join(f"#SBATCH {a}" for a in native), python=sys.executable,
                                         before=tmp_path / "before.sh", script=tmp_path / "script.sh", tmp=tmp_path,
                                         nb=nb, out=out, root=ROOT))
    job = slurm.sbatch([f"--output={tmp_path}/ood.out", str(job_script)],
                       env=job_env(slurm, tmp_path, RUNNER=RUNNER, JUPYTER_CONFIG_DIR=config,
                                   JUPYTER_RUNTIME_DIR=tmp_path / "runtime"), cwd=tmp_path)
    info = slurm.wait(job, timeout=300)
    log = (tmp_path / "ood.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and "LAB 200" in log, f"{completed(info)}\n{log[-3000:]}\n" + \
        (tmp_path / "lab.log").read_text(errors="replace")[-2000:]
    text = "\n".join(o.get("text", "") for c in nbformat.read(out, as_version=4).cells for o in c.get("outputs", []))
    engines = eval(re.search(r"ENGINES (\[.*\])", text).group(1))  # noqa: S307 - our own notebook's output
    assert [e[:2] for e in engines] == [(r, job) for r in range(2)], text    # the engines run in this very job
