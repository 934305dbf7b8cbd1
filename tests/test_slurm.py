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
import sys
import time
from pathlib import Path

import nbformat
import pytest

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


# ---------------------------------------------------------------- shared by the Slurm tests

def no_jobs_left(slurm, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(1)
    return not slurm.jobs()


def connect_in(slurm, tmp_path, code: str, timeout: float = 400):
    return slurm.run([sys.executable, "-c", "from hpclab import cluster\n" + code], env=job_env(slurm, tmp_path),
                     timeout=timeout, cwd=ROOT)
