"""The Slurm tier: every slurm/*.sbatch template and the three routes on a real Slurm.

A two-node Slurm runs in two network namespaces joined by a veth pair and nothing else
(tests/slurm_local.py: fake GPU GRES, a private munged; each slurmd and its jobs in their own PID
namespace, like a compute node, node2 also with its own host name). Everything that talks to Slurm
or to the engines runs in the first namespace, as it would on a login node. Skipped, with the
reason, where this machine cannot run Slurm (not root, no apt-get).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
import yaml

from . import slurm_local
from .helpers import ROOT

pytestmark = pytest.mark.slurm

NB = ROOT / "notebooks" / "01_collectives.ipynb"


@pytest.fixture(scope="module")
def slurm():
    reason = slurm_local.unavailable()
    if reason:
        pytest.skip(reason)
    try:
        note = slurm_local.install()
    except (slurm_local.SlurmUnavailable, OSError) as exc:
        pytest.skip(f"cannot install Slurm here: {exc}")
    s = slurm_local.LocalSlurm.create()
    s.start()
    print(f"{note}; {s.run(['sinfo', '-V']).stdout.strip()} up in {s.root}")
    try:
        yield s
    finally:
        s.stop()
        shutil.rmtree(s.root, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(slurm):
    """A test that fails half-way must not leave jobs holding the node's GPUs for the tests after it."""
    yield
    left = slurm.jobs()
    if left:
        slurm.run(["scancel", *left], timeout=30)
        no_jobs_left(slurm, 30)


def job_env(slurm, tmp_path: Path, **extra) -> dict:
    """What the submitting shell has: the simulator, a private IPython dir, this Python's environment."""
    # (the simulator, unless HPCLAB_SLURM_BACKEND says otherwise: tests/test_slurm_gpu.py runs some of these on GPUs)
    e = slurm.env(HPCLAB_BACKEND=os.environ.get("HPCLAB_SLURM_BACKEND", "sim"), IPYTHONDIR=str(tmp_path / "ipython"),
                  HPCLAB_ALLOW_LOCAL_ENGINES="0")
    e.pop("NCCL_NVLS_ENABLE", None)  # a job has it only if the submitter asks: nothing here sets it
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["PATH"] = str(Path(sys.executable).parent) + os.pathsep + e["PATH"]
    if sys.prefix != sys.base_prefix:
        e["HPCLAB_ENV"] = sys.prefix  # the environment running these tests, wherever it lives
    e["HPCLAB_PYTHON"] = sys.executable  # this Python in the jobs too (not another python on their PATH)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def submit(slurm, template: str, tmp_path: Path, *opts: str, output: bool = True, **env) -> str:
    args = list(opts)
    if output:  # keep test logs out of the checkout's slurm/logs/
        args.append(f"--output={tmp_path}/%x-%j.out")
    return slurm.sbatch([*args, f"slurm/{template}"], env=job_env(slurm, tmp_path, **env), cwd=ROOT)


def log_of(info: dict) -> str:
    return Path(info["StdOut"]).read_text(errors="replace") if Path(info["StdOut"]).exists() else ""


def last_json(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON line in the job's log:\n{text[-3000:]}"
    return json.loads(lines[-1])


def completed(info: dict) -> str:
    """An assertion message with the job's state and log tail."""
    return f"job {info.get('JobId')} {info.get('JobState')} {info.get('ExitCode')}:\n{log_of(info)[-3000:]}"


# ---------------------------------------------------------------- batch templates

TWO_GPUS = ("--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1")
TEMPLATES = {  # template: (sbatch options, environment, the program's exercise name)
    "ex0_collectives.sbatch": (TWO_GPUS, {}, "collectives"),
    "ex1_pi_midpoint.sbatch": (TWO_GPUS, {"BINS": "1e4"}, "pi-midpoint"),
    "ex2_pi_mc.sbatch": (TWO_GPUS, {"SAMPLES": "1e5", "SEED": "7"}, "pi-mc"),
    "ex3_pi_nccl_node.sbatch": (("--gpus-per-node=2", "--cpus-per-task=1"), {}, "pi-nccl-node"),
    "ex5_ddp_mlp.sbatch": (TWO_GPUS, {}, "ddp-mlp"),
    "ex5_ddp_digits.sbatch": (TWO_GPUS, {}, "ddp-digits"),
    "matmul.sbatch": (TWO_GPUS, {}, "matmul"),
    "conv_halo.sbatch": (TWO_GPUS, {}, "conv-halo"),
}


def test_every_template_runs_unchanged_as_one_mpi_job_without_nvls_set(slurm, tmp_path):
    assert {p.name for p in (ROOT / "slurm").glob("*.sbatch")} == \
        {*TEMPLATES, "ex4_pi_nccl_mpi.sbatch", "ex6_torch_ddp.sbatch", "scaling.sbatch"}  # (those: below)
    jobs = {name: submit(slurm, name, tmp_path, *opts, **env) for name, (opts, env, _) in TEMPLATES.items()}
    for name, job in jobs.items():
        info = slurm.wait(job, timeout=300)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{name}: {completed(info)}"
        text = log_of(info)
        ranks = 1 if name.startswith("ex3") else 2
        # the flavour was chosen for the mpich wheel, and the ranks are one MPI job (not 2 singletons)
        assert f"launch: srun --mpi=pmi2 --kill-on-bad-exit=1 -n {ranks}, NCCL_NVLS_ENABLE unset" in text, text[-2000:]
        record = last_json(text)
        assert record["exercise"] == TEMPLATES[name][2] and record["passed"] is True, record
        assert record["ranks"] == ranks and record["backend"] == "sim", record


def test_two_node_template_puts_its_ranks_on_both_nodes_as_asked(slurm, tmp_path):
    info = slurm.wait(submit(slurm, "ex4_pi_nccl_mpi.sbatch", tmp_path, "--partition=two", *TWO_GPUS), timeout=300)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "node[1-2]", completed(info)
    text = log_of(info)
    hosts = dict(re.findall(r"^rank (\d+) on (\S+)$", text, re.M))
    node1 = hosts.get("0")
    assert len(hosts) == 4 and node1 != "node2" and hosts == {"0": node1, "1": node1, "2": "node2", "3": "node2"}, text
    record = last_json(text)
    assert record["passed"] is True and record["ranks"] == 4, record


def test_torch_template_stops_with_one_line_where_pytorch_is_missing(slurm, tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here: the template would train (checked on GPUs)")
    info = slurm.wait(submit(slurm, "ex6_torch_ddp.sbatch", tmp_path, *TWO_GPUS), timeout=120)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", completed(info)
    said = [ln for ln in log_of(info).splitlines() if "PyTorch" in ln]
    assert len(said) == 1 and "is not installed for" in said[0] and "pip install torch" in said[0], log_of(info)


def test_site_options_reach_every_job_a_reservation_through_sbatch_its_variables_and_init(slurm, tmp_path):
    made = slurm.run(["scontrol", "create", "reservation", "ReservationName=workshop", "Users=root", "Nodes=node1",
                      "StartTime=now", "Duration=30", "Flags=IGNORE_JOBS"])
    assert made.returncode == 0, made.stderr
    try:
        by_option = submit(slurm, "ex0_collectives.sbatch", tmp_path, "--reservation=workshop", *TWO_GPUS)
        by_variable = submit(slurm, "ex2_pi_mc.sbatch", tmp_path, *TWO_GPUS, SAMPLES="1e4", SBATCH_RESERVATION="workshop")
        for job in (by_option, by_variable):
            info = slurm.wait(job, timeout=240)
            assert info["JobState"] == "COMPLETED" and info["Reservation"] == "workshop", completed(info)
        # the engines job of a profile: the option of hpclab cluster init, and SBATCH_* where sbatch runs
        said = init_profile(slurm, tmp_path, "--reservation", "workshop", "--qos", "normal", "--idle", "1")
        assert "reservation workshop, qos normal" in said, said
        proc = connect_in(slurm, tmp_path, "s = cluster.connect(n=4, timeout=120)\nprint('JOB', s.job)\n")
        job = re.search(r"^JOB (\d+)", proc.stdout, re.M)
        assert job and slurm.job(job.group(1))["Reservation"] == "workshop", proc.stdout + proc.stderr
        assert "reservation workshop" in proc.stdout
        assert "cancelled Slurm job" in hpclab_in(slurm, tmp_path, "cluster", "stop").stdout
        init_profile(slurm, tmp_path)  # no site option in the profile: SBATCH_* where the notebook runs
        proc = slurm.run([sys.executable, "-c", "from hpclab import cluster\ns = cluster.connect(n=4, timeout=120)\n"
                          "print('JOB', s.job)\n"], env=job_env(slurm, tmp_path, SBATCH_RESERVATION="workshop"),
                         timeout=400, cwd=ROOT)
        job = re.search(r"^JOB (\d+)", proc.stdout, re.M)
        assert job and slurm.job(job.group(1))["Reservation"] == "workshop", proc.stdout + proc.stderr
        hpclab_in(slurm, tmp_path, "cluster", "stop")
    finally:
        slurm.run(["scontrol", "delete", "reservation", "workshop"])


def test_doctor_site_reads_the_partition_a_reservation_and_a_test_submission_from_slurm(slurm, tmp_path):
    made = slurm.run(["scontrol", "create", "reservation", "ReservationName=day", "Users=root", "Nodes=node1",
                      "StartTime=now", "Duration=30", "Flags=IGNORE_JOBS"])
    assert made.returncode == 0, made.stderr

    def site(*args):
        proc = hpclab_in(slurm, tmp_path, "doctor", "--site", "-p", "gpu", *args)
        return proc.returncode, {ln.split(":", 1)[0][6:]: ln for ln in proc.stdout.splitlines() if ln[:4].isupper()}

    try:
        code, lines = site("--gpus-per-node", "4", "--learners", "2", "--reservation", "day")
        assert code == 0, lines
        assert lines["Slurm"].startswith("PASS") and "UP" in lines["Slurm"]
        assert lines["partition gpu"].startswith("PASS  partition gpu: up; 1 nodes (1 usable) with 8 GPUs each")
        assert lines["reservation day"].startswith("PASS") and "(node1)" in lines["reservation day"]
        assert "room for 2 such jobs" in lines["GPUs for the room"] and lines["GPUs for the room"].startswith("PASS")
        assert lines["GPU limits"].startswith("SKIP  GPU limits: no accounting database")   # (none here)
        assert lines["engines job"].startswith("PASS") and "to start at" in lines["engines job"]
        code, lines = site("--gpus-per-node", "4", "--learners", "3", "--reservation", "day")
        assert code == 0 and lines["GPUs for the room"].startswith("WARN"), lines
        code, lines = site("--gpus-per-node", "16")
        assert code == 1 and lines["partition gpu"].startswith("FAIL") and lines["engines job"].startswith("FAIL")
        assert lines["reservation"].startswith("SKIP")
        code, lines = site("--reservation", "nosuch")
        assert code == 1 and lines["reservation nosuch"].startswith("FAIL"), lines
    finally:
        slurm.run(["scontrol", "delete", "reservation", "day"])


def test_template_output_goes_to_the_gitignored_logs_folder(slurm, tmp_path):
    info = slurm.wait(submit(slurm, "ex0_collectives.sbatch", tmp_path, *TWO_GPUS, output=False), timeout=240)
    log = Path(info["StdOut"])
    try:
        assert log.parent == ROOT / "slurm" / "logs" and log.name == f"hpclab-ex0-{info['JobId']}.out"
        assert info["JobState"] == "COMPLETED", completed(info)
    finally:
        log.unlink(missing_ok=True)


def test_scaling_template_writes_csv_and_figure_under_build(slurm, tmp_path):
    out = tmp_path / "scaling"
    info = slurm.wait(submit(slurm, "scaling.sbatch", tmp_path, *TWO_GPUS, TRIALS=1, HPCLAB_OUT=out,
                             PROGRAM_ARGS="--samples 1e4 --seed 3"), timeout=300)
    assert info["JobState"] == "COMPLETED", completed(info)
    rows = list(csv.DictReader((out / "pi-mc_strong.csv").open()))
    assert {r["ranks"] for r in rows} == {"1", "2"} and all(r["passed"] == "True" for r in rows), rows
    assert list(out.glob("*.png")), list(out.iterdir())


def test_template_default_result_folder_is_under_build(slurm, tmp_path):
    """Without HPCLAB_OUT, results go to build/slurm/<job name>-<job id>/ (never the checkout's root)."""
    info = slurm.wait(submit(slurm, "scaling.sbatch", tmp_path, *TWO_GPUS, TRIALS=1, RANKS="2",
                             PROGRAM_ARGS="--samples 1e4"), timeout=300)
    folder = ROOT / "build" / "slurm" / f"hpclab-scaling-{info['JobId']}"
    try:
        assert info["JobState"] == "COMPLETED", completed(info)
        assert (folder / "pi-mc_strong.csv").exists(), list(folder.parent.iterdir())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_failing_program_fails_the_job(slurm, tmp_path):
    info = slurm.wait(submit(slurm, "ex1_pi_midpoint.sbatch", tmp_path, *TWO_GPUS, BINS="lots"), timeout=240)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", completed(info)
    assert "--bins" in log_of(info)


def test_wrong_mpi_flavour_fails_the_job_and_diagnose_names_job_log_and_fix(slurm, tmp_path):
    job = submit(slurm, "ex0_collectives.sbatch", tmp_path, *TWO_GPUS, HPCLAB_SRUN_MPI="pmix")
    info = slurm.wait(job, timeout=240)
    assert info["JobState"] == "FAILED", completed(info)
    message = diagnose_in(slurm, job, tmp_path)
    print(message)
    assert f"Slurm job {job} (hpclab-ex0) FAILED" in message and info["StdOut"] in message, message
    assert "pmix" in message.lower() and "pmi2" in message, message


def diagnose_in(slurm, job: str, tmp_path: Path) -> str:
    proc = slurm.run([sys.executable, "-m", "hpclab.cluster", "diagnose", job], env=job_env(slurm, tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


# ---------------------------------------------------------------- engines: helpers run "on the login node"

PROBE = """
import json, os, sys, ipyparallel as ipp
client = ipp.Client(profile=sys.argv[1], timeout=30)
client.wait_for_engines(int(sys.argv[2]), timeout=180)
def where():
    import os, socket
    from hpclab.device import local_rank
    from mpi4py import MPI
    lrank, lsize = local_rank()
    return dict(rank=MPI.COMM_WORLD.rank, size=MPI.COMM_WORLD.size, local_rank=lrank, local_size=lsize,
                gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""), job=os.environ.get("SLURM_JOB_ID", ""),
                pid=os.getpid())
print(json.dumps(client[:].apply_sync(where)))
client.close()
"""


def probe(slurm, tmp_path: Path, n: int, profile: str = "default") -> list[dict]:
    proc = slurm.run([sys.executable, "-c", PROBE, profile, str(n)], env=job_env(slurm, tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_one_gpu_per_rank(engines: list[dict], n: int) -> None:
    """One MPI job of n ranks on one node, each picking GPU local_rank % visible GPUs: all different."""
    assert sorted(e["rank"] for e in engines) == list(range(n)) and {e["size"] for e in engines} == {n}, engines
    assert sorted(e["local_rank"] for e in engines) == list(range(n)), engines
    visible = {len(e["gpus"].split(",")) for e in engines}
    assert visible == {4}, engines  # the job's 4 (fake) GPUs, as Slurm sets CUDA_VISIBLE_DEVICES
    assert len({e["local_rank"] % 4 for e in engines}) == n


def run_notebook(slurm, tmp_path: Path, **env) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-cell-timeout=300",
           "--rootdir", str(NB.parent), str(NB)]
    proc = slurm.run(cmd, env=job_env(slurm, tmp_path, **env), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


DONE = """
import json, sys, ipyparallel as ipp
client = ipp.Client(profile=sys.argv[1], timeout=30)
print(json.dumps({str(e): q["completed"] for e, q in client.queue_status().items() if e != "unassigned"}))
client.close()
"""


def tasks_done(slurm, tmp_path: Path, profile: str = "default") -> dict[str, int]:
    """How many requests each engine of the profile's shared cluster has completed (the controller counts)."""
    proc = slurm.run([sys.executable, "-c", DONE, profile], env=job_env(slurm, tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_notebook_ran_on_these_engines(slurm, tmp_path: Path, before: dict[str, int], n: int,
                                         profile: str = "default") -> None:
    """Every engine of the cluster ran at least the notebook's %%px cells (not engines of its own).
    (Its names are gone: closing the session gives the engines back with an empty namespace.)"""
    cells = sum(c.source.lstrip().startswith("%%px") for c in nbformat.read(NB, as_version=4).cells)
    after = tasks_done(slurm, tmp_path, profile)
    assert len(after) == n and all(after[e] - before.get(e, 0) >= cells for e in after), (before, after, cells)


def hpclab_in(slurm, tmp_path: Path, *args: str):
    return slurm.run([sys.executable, "-m", "hpclab", *args], env=job_env(slurm, tmp_path), timeout=120, cwd=ROOT)


def stale_cluster_file(profile_dir: Path, job: str) -> Path:
    """A cluster file as a shared engines job leaves it when its controller was killed long ago."""
    sec = profile_dir / "security"
    sec.mkdir(parents=True, exist_ok=True)
    (sec / "ipcontroller-client.json").write_text("{}")
    cfile = sec / "cluster-.json"
    cfile.write_text(json.dumps({
        "cluster": {"class": "ipyparallel.cluster.cluster.Cluster", "profile_dir": str(profile_dir), "cluster_id": "",
                    "controller_ip": "*", "n": 4},
        "controller": {"class": "ipyparallel.cluster.launcher.LocalControllerLauncher",
                       "state": {"pid": 4242424, "state": "running", "profile_dir": str(profile_dir), "cluster_id": ""}},
        "engines": {"class": "ipyparallel.cluster.launcher.SlurmEngineSetLauncher",
                    "sets": {"1": {"job_id": job, "state": "running", "n": 4, "profile_dir": str(profile_dir)}}}}))
    return cfile


# ---------------------------------------------------------------- engines through ipyparallel's Slurm launcher

def init_profile(slurm, tmp_path, *extra: str, profile: str = "default"):
    proc = hpclab_in(slurm, tmp_path, "cluster", "init", "--slurm", "--partition", "gpu", "--gpus-per-node", "4",
                     "--engines", "4", "--time", "00:10:00", "--controller-location", "127.0.0.1",
                     "--profile", profile, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def engine_job_of(profile_dir: Path) -> str:
    data = json.loads((profile_dir / "security" / "cluster-.json").read_text())
    return next(s["job_id"] for s in data["engines"]["sets"].values())


def test_slurm_launcher_profile_serves_a_notebook(slurm, tmp_path):
    said = init_profile(slurm, tmp_path)
    assert re.search(r"MPI launch: srun --mpi=pmi2 \(MPICH .*mpich wheel\) speaks pmi2; srun offers .*pmi2", said), said
    e = job_env(slurm, tmp_path)
    start = slurm.run(["ipcluster", "start", "--daemonize"], env=e, timeout=120, cwd=tmp_path)
    assert start.returncode == 0, start.stdout + start.stderr
    pdir = tmp_path / "ipython" / "profile_default"
    job = engine_job_of(pdir)
    try:
        engines = probe(slurm, tmp_path, 4)
        assert_one_gpu_per_rank(engines, 4)
        assert {e["job"] for e in engines} == {job}
        info = slurm.job(job)
        assert info["Partition"] == "gpu" and info["NumTasks"] == "4" and "gpu:4" in info.get("TresPerNode", ""), info
        assert Path(info["StdOut"]).parent == pdir / "log"  # the job's log in the profile, not the cwd
        assert not list(tmp_path.glob("*.sbatch")) and list((pdir / "log").glob("slurm_engines_*.sbatch"))
        before = tasks_done(slurm, tmp_path)
        run_notebook(slurm, tmp_path)
        assert_notebook_ran_on_these_engines(slurm, tmp_path, before, 4)
    finally:
        stop = slurm.run(["ipcluster", "stop"], env=e, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert slurm.wait(job, timeout=60)["JobState"] == "CANCELLED"


def test_slurm_launcher_with_a_wrong_mpi_flavour_is_diagnosed(slurm, tmp_path):
    init_profile(slurm, tmp_path, "--mpi", "pmix", profile="broken")
    e = job_env(slurm, tmp_path)
    start = slurm.run(["ipcluster", "start", "--profile=broken", "--daemonize"], env=e, timeout=120, cwd=tmp_path)
    assert start.returncode == 0, start.stdout + start.stderr
    pdir = tmp_path / "ipython" / "profile_broken"
    job = engine_job_of(pdir)
    try:
        info = slurm.wait(job, timeout=120)
        assert info["JobState"] == "FAILED", completed(info)
        message = diagnose_in(slurm, job, tmp_path)
        print(message)
        assert f"Slurm job {job} (hpclab-engines) FAILED" in message and info["StdOut"] in message, message
        assert "pmi2" in message, message
    finally:
        slurm.run(["ipcluster", "stop", "--profile=broken"], env=e, timeout=120)


# ---------------------------------------------------------------- connect() with engines from Slurm

def no_jobs_left(slurm, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(1)
    return not slurm.jobs()


def connect_in(slurm, tmp_path, code: str, timeout: float = 400):
    return slurm.run([sys.executable, "-c", "from hpclab import cluster\n" + code], env=job_env(slurm, tmp_path),
                     timeout=timeout, cwd=ROOT)


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
