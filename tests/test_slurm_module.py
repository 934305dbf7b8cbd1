"""hpclab.cluster's Slurm parts without a Slurm: flavour choice and the one srun line, the profile
ipyparallel loads, job diagnosis (against stand-in scontrol/sacct/scancel that print what Slurm 22.05
prints), the routes and the login-node rule. tests/test_slurm.py runs the same on a real Slurm."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpclab.cluster import jobs
from hpclab.cluster import mpi as flavour
from hpclab.cluster import profile as prof
from hpclab.cluster import routes as guard

from .helpers import ROOT, env

WHEEL = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026\nMPICH Device:       ch4:ucx ofi\n"
         "MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n"
         "MPICH Custom Information:\thttps://pypi.org/p/mpich/5.0.2/\n")
OPENMPI = "Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023"
MPICH_PMIX = "MPICH Version:      4.2.0\nMPICH configure:    --with-pmi=pmix --with-pmix=/usr\n"
SRUN_LIST = "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\nspecific pmix plugin versions available: pmix_v4\n"


# ---------------------------------------------------------------- srun --mpi flavour

@pytest.mark.parametrize("version,offered,expected", [
    (WHEEL, ["pmix", "none", "cray_shasta", "pmi2"], "pmi2"),
    (OPENMPI, ["pmix", "none", "cray_shasta", "pmi2"], "pmix"),
    (OPENMPI, ["none", "pmi2"], "pmi2"),
    (MPICH_PMIX, ["pmix", "pmi2"], "pmix"),
    ("Intel(R) MPI Library 2021.10", ["pmix", "pmi2"], "pmi2"),
])
def test_flavour_is_what_both_the_mpi_and_srun_speak(version, offered, expected):
    choice = flavour.choose("auto", version=version, offered=offered)
    assert choice.flavour == expected
    assert "srun offers" in choice.reason and "speaks" in choice.reason


def test_flavour_names_the_mpich_wheel_and_says_when_srun_could_not_confirm():
    choice = flavour.choose("auto", version=WHEEL, offered="srun is not on PATH here to confirm it")
    assert choice.flavour == "pmi2"
    assert choice.reason == "MPICH 5.0.2 (the PyPI mpich wheel) speaks pmi2; srun is not on PATH here to confirm it"


def test_flavour_that_srun_lacks_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"speaks pmi2, but srun here offers only pmix, none: .*module load"):
        flavour.choose("auto", version=WHEEL, offered=["pmix", "none"])


def test_explicit_flavour_is_kept_and_a_bogus_one_refused():
    assert flavour.choose("pmix").flavour == "pmix" and flavour.choose("pmix").reason == "as asked"
    with pytest.raises(ValueError, match="--mpi 'pmi3'"):
        flavour.choose("pmi3")


def fake_bin(tmp_path: Path, **scripts: str) -> Path:
    """Executables named after the keyword arguments, in a folder to put first on PATH."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = d / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return d


@pytest.mark.parametrize("listing,expected", [
    (SRUN_LIST, ["pmix", "none", "cray_shasta", "pmi2"]),
    ("srun: MPI types are...\nsrun: none\nsrun: pmi2\nsrun: pmix_v3\n", ["none", "pmi2", "pmix_v3", "pmix"]),
])
def test_srun_list_is_read_in_old_and_new_formats(tmp_path, monkeypatch, listing, expected):
    (tmp_path / "listing").write_text(listing)
    bindir = fake_bin(tmp_path, srun=f"cat {tmp_path}/listing\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert flavour.srun_flavours() == expected


def test_the_mpi_in_use_is_found_without_initialising_it():
    assert flavour.family(flavour.library_version())[0] != "unknown"
    proc = subprocess.run([sys.executable, "-m", "hpclab.cluster", "mpi", "pmi2"], capture_output=True, text=True,
                          env=env(), cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "pmi2", proc.stderr


def test_the_srun_line_has_one_definition_that_the_templates_ask_for():
    proc = subprocess.run([sys.executable, "-m", "hpclab.cluster", "srun", "pmi2"], capture_output=True, text=True,
                          env=env(), cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "srun --mpi=pmi2 --kill-on-bad-exit=1" == " ".join(flavour.srun_command("pmi2"))
    shell = {p.name: p.read_text() for p in (ROOT / "slurm").iterdir() if p.is_file()}
    assert "-m hpclab.cluster srun" in shell["common.sh"]
    assembled = [name for name, text in shell.items() if re.search(r"^[^#]*(srun\s+--mpi|--kill-on-bad-exit)", text, re.M)]
    assert not assembled, f"{assembled} assemble the srun line themselves"


def test_no_template_or_helper_sets_nccl_nvls_enable():
    """NVLink SHARP stays as the site has it: only an explicit NCCL_NVLS_ENABLE from the submitter reaches a job."""
    texts = [p.read_text() for p in [*(ROOT / "slurm").iterdir(), *(ROOT / "hpclab" / "cluster").glob("*.py")]
             if p.is_file()]
    assert not [t for t in texts if re.search(r"^[^#]*NCCL_NVLS_ENABLE\s*=", t, re.M)]


# ---------------------------------------------------------------- the profile

def init(tmp_path, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return subprocess.run([sys.executable, "-m", "hpclab", "cluster", "init", *args], capture_output=True,
                          text=True, timeout=120, env=env(IPYTHONDIR=tmp_path / "ipython"), cwd=ROOT)


def test_cluster_init_writes_a_profile_that_ipyparallel_turns_into_the_engine_job(tmp_path, monkeypatch):
    proc = init(tmp_path, monkeypatch, "--slurm", "--partition", "gpu-a100", "--gpus-per-node", "4", "--nodes", "2",
                "--account", "proj42", "--time", "00:30:00", "--mpi", "pmi2", "--setup", "module load cuda/12")
    assert proc.returncode == 0, proc.stderr
    assert "MPI launch: srun --mpi=pmi2 (as asked)" in proc.stdout and "8 engines" in proc.stdout
    pdir = tmp_path / "ipython" / "profile_default"
    assert guard.profile_is_slurm(str(pdir))
    settings = prof.settings(str(pdir))
    assert (settings["partition"], settings["engines"], settings["srun"][1], settings["account"]) == (
        "gpu-a100", 8, "--mpi=pmi2", "proj42")
    assert settings["idle"] == 90           # by default the engines job outlives a 60-minute lunch

    import ipyparallel as ipp
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

    cluster = ipp.Cluster(profile_dir=str(pdir), cluster_id="abc")
    assert cluster.engine_launcher_class is SlurmEngineSetLauncher
    assert cluster.controller_ip == "*" and cluster.n == 8
    launcher = cluster.engine_launcher_class(parent=cluster, profile_dir=str(pdir), cluster_id="abc")
    launcher.write_batch_script(8)
    batch = Path(launcher.batch_file)
    assert batch.parent == pdir / "log" and batch.name.startswith("slurm_engines_")
    script = batch.read_text()
    for line in ("#SBATCH --partition=gpu-a100", "#SBATCH --account=proj42", "#SBATCH --nodes=2",
                 "#SBATCH --ntasks=8", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --time=00:30:00", f"#SBATCH --output={pdir}/log/", "module load cuda/12",
                 "srun --mpi=pmi2 --kill-on-bad-exit=1 ", "-m ipyparallel.engine --mpi"):
        assert line in script, f"{line!r} not in\n{script}"
    if sys.prefix != sys.base_prefix:
        assert f"source {sys.prefix}/bin/activate" in script


def test_cluster_init_passes_the_sites_options_to_the_engines_job(tmp_path, monkeypatch):
    proc = init(tmp_path, monkeypatch, "--slurm", "-p", "gpu", "--gpus-per-node", "4", "--mpi", "pmi2",
                "--reservation", "workshop", "--qos", "short", "--constraint", "h100", "--account", "proj",
                "--time", "00:20:00", "--idle", "45")
    assert proc.returncode == 0, proc.stderr
    assert "reservation workshop, qos short, constraint h100, account proj" in proc.stdout, proc.stdout
    assert "after 45 min without a notebook" in proc.stdout

    import ipyparallel as ipp

    pdir = tmp_path / "ipython" / "profile_default"
    cluster = ipp.Cluster(profile_dir=str(pdir), cluster_id="x")
    launcher = cluster.engine_launcher_class(parent=cluster, profile_dir=str(pdir), cluster_id="x")
    launcher.write_batch_script(4)
    script = Path(launcher.batch_file).read_text()
    for line in ("#SBATCH --reservation=workshop", "#SBATCH --qos=short", "#SBATCH --constraint=h100",
                 "#SBATCH --account=proj", "#SBATCH --time=00:20:00", "#SBATCH --gpus-per-node=4"):
        assert line in script, f"{line!r} not in\n{script}"
    assert prof.settings(str(pdir))["idle"] == 45


@pytest.mark.parametrize("args,message", [
    (["--slurm", "--gpus-per-node", "4"], "--partition and --gpus-per-node are required"),
    (["--slurm", "-p", "gpu", "--gpus-per-node", "4", "--nodes", "2", "--engines", "9"],
     "--engines 9 do not fit on --nodes 2 with --gpus-per-node 4"),
    (["--slurm", "-p", "gpu", "--gpus-per-node", "4", "--setup", "export X=${HOME}"], "write $VAR, not ${VAR}"),
    (["--slurm", "-p", "gpu", "--gpus-per-node", "0"], "must be at least 1"),
    (["-p", "gpu", "--gpus-per-node", "4"], "only --slurm profiles"),
])
def test_cluster_init_refuses_bad_input_with_a_message(tmp_path, monkeypatch, args, message):
    proc = init(tmp_path, monkeypatch, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_cluster_init_keeps_a_config_it_did_not_write(tmp_path, monkeypatch):
    pdir = tmp_path / "ipython" / "profile_default"
    pdir.mkdir(parents=True)
    (pdir / "ipcluster_config.py").write_text("c = get_config()\n")
    args = ["--slurm", "-p", "gpu", "--gpus-per-node", "4", "--mpi", "pmi2"]
    proc = init(tmp_path, monkeypatch, *args)
    assert proc.returncode == 2 and "was not written by hpclab cluster init" in proc.stderr
    assert init(tmp_path, monkeypatch, *args, "--force").returncode == 0
    assert init(tmp_path, monkeypatch, *args).returncode == 0  # its own file is replaced


def test_a_hand_written_slurm_profile_counts_as_slurm(tmp_path):
    pdir = tmp_path / "profile_site"
    pdir.mkdir()
    assert not guard.profile_is_slurm(str(pdir))
    (pdir / "ipcluster_config.py").write_text("c = get_config()\nc.Cluster.engine_launcher_class = 'Slurm'\n")
    assert guard.profile_is_slurm(str(pdir))


# ---------------------------------------------------------------- the login-node rule

@pytest.fixture
def login_node(tmp_path, monkeypatch):
    """sbatch on PATH with a controller that answers, no GPU, not in a job, no override."""
    bindir = fake_bin(tmp_path, sbatch="exit 1\n", scontrol='echo "Slurmctld(primary) at head is UP"\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(guard.ALLOW, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(guard, "_gpus", lambda: 0)
    return tmp_path


def test_login_node_without_gpu_refuses_local_engines_and_says_what_to_do(login_node):
    reason = guard.login_node_guard(str(login_node / "ipython" / "profile_default"))
    assert "Slurm login node" in reason and "hpclab cluster init --slurm" in reason
    assert "JupyterLab inside an allocation" in reason and "HPCLAB_ALLOW_LOCAL_ENGINES=1" in reason


def test_local_engines_are_allowed_in_a_job_with_a_gpu_or_when_asked(login_node, monkeypatch):
    ipd = str(login_node / "ipython" / "profile_default")
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    assert guard.login_node_guard(ipd) is None
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setattr(guard, "_gpus", lambda: 2)
    assert guard.login_node_guard(ipd) is None
    monkeypatch.setattr(guard, "_gpus", lambda: 0)
    monkeypatch.setenv(guard.ALLOW, "1")
    assert guard.login_node_guard(ipd) is None
    monkeypatch.setenv(guard.ALLOW, "0")
    assert "forbids" in guard.login_node_guard(ipd)


def test_no_sbatch_means_a_laptop_and_local_engines(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_bin(tmp_path, true="exit 0\n")))
    monkeypatch.delenv(guard.ALLOW, raising=False)
    monkeypatch.setattr(guard, "_gpus", lambda: 0)
    assert guard.login_node_guard(str(tmp_path)) is None


def test_slurm_commands_without_a_cluster_do_not_make_a_login_node(login_node, monkeypatch):
    # e.g. slurm-client installed on a workstation, or a single-node test Slurm whose daemons have stopped
    fake_bin(login_node, scontrol='echo "scontrol: fatal: Could not establish a configuration source" >&2\nexit 1\n')
    assert guard.login_node_guard(str(login_node / "ipython" / "profile_default")) is None
    fake_bin(login_node, scontrol="sleep 30\n")          # configured, its controller silent: still a login node
    assert "Slurm login node" in guard.login_node_guard(str(login_node / "ipython" / "profile_default"))


def test_a_slurm_profile_never_gets_local_engines(login_node, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")  # even inside a job
    pdir = login_node / "ipython" / "profile_default"
    pdir.mkdir(parents=True)
    (pdir / prof.SETTINGS_FILE).write_text("{}")
    assert "starts its engines through Slurm" in guard.login_node_guard(str(login_node / "ipython" / "profile_default"))


# ---------------------------------------------------------------- job states in words

SCONTROL = """#!/bin/bash
# scontrol show job -o ID: the line stored for ID, nothing (exit 1) for unknown jobs
f="$FAKE_SLURM/job_${@: -1}"
[ -f "$f" ] || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
cat "$f"
"""
SACCT = """#!/bin/bash
for a in "$@"; do id=$a; [ "$prev" = "-j" ] && break; prev=$a; done
f="$FAKE_SLURM/sacct_$id"; [ -f "$f" ] && cat "$f"; exit 0
"""
SCANCEL = 'echo "$@" >> "$FAKE_SLURM/scancel.log"\n'


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir()
    bindir = fake_bin(tmp_path, scontrol=SCONTROL.split("\n", 1)[1], sacct=SACCT.split("\n", 1)[1], scancel=SCANCEL)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))

    def job(job_id, state_, reason="None", exit_code="0:0", log="", nodes="gpu07", name="hpclab-engines"):
        (state / f"job_{job_id}").write_text(
            f"JobId={job_id} JobName={name} UserId=ann(1000) JobState={state_} Reason={reason} Dependency=(null) "
            f"ExitCode={exit_code} RunTime=00:00:42 TimeLimit=01:00:00 Partition=gpu NodeList={nodes} "
            f"NumNodes=1 NumTasks=4 StdErr={log} StdOut={log}\n")
    job.state = state
    return job


def test_pending_job_says_why_and_what_to_do(fake_slurm):
    fake_slurm(11, "PENDING", reason="Resources", nodes="(null)")
    assert jobs.report(11) == "Slurm job 11 (hpclab-engines) PENDING (Resources)"
    assert jobs.active(11)
    assert "waiting for free GPUs/nodes. Fix: it starts when they free up (`squeue -j 11 --start`" in jobs.diagnose(11)
    fake_slurm(12, "PENDING", reason="PartitionTimeLimit", nodes="(null)")
    assert "longer than partition gpu allows" in jobs.diagnose(12)
    fake_slurm(13, "PENDING", reason="QOSMaxGRESPerUser", nodes="(null)")
    assert "a site limit holds it (QOSMaxGRESPerUser)" in jobs.diagnose(13)


def test_running_job_names_its_nodes_and_log(fake_slurm, tmp_path):
    fake_slurm(21, "RUNNING", log=str(tmp_path / "e.log"))
    assert jobs.report(21) == f"Slurm job 21 (hpclab-engines) RUNNING on gpu07 for 00:00:42; log: {tmp_path}/e.log"


@pytest.mark.parametrize("log_line,cause,fix", [
    ("Abort(...) Runtime environment uses unsupported PMI version PMIx. Aborting.", "does not speak PMIx",
     "hpclab cluster init --slurm --mpi pmi2"),
    ("srun: error:  mpi/pmix_v4: init: (null) [0]: mpi_pmix.c:195: pmi/pmix: can not load PMIx library",
     "cannot load libpmix", "HPCLAB_SRUN_MPI=pmi2"),
    ("ModuleNotFoundError: No module named 'numba'", "has no module numba", "--setup"),
    ("slurmstepd: error: *** JOB 31 ON gpu07 CANCELLED AT 2026-11-23T10:00:00 DUE TO TIME LIMIT ***",
     "reached its time limit", "--time"),
    ("2026-11-26 10:00:01.234 [IPEngine] CRITICAL | Registration timed out after 5.0 seconds",
     "could not reach the controller", "JupyterLab inside an allocation"),
])
def test_failed_job_is_diagnosed_from_its_log(fake_slurm, tmp_path, log_line, cause, fix):
    log = tmp_path / "job.log"
    log.write_text(f"hpclab engines: job 31 on gpu07\nsome output\n{log_line}\nsrun: error: gpu07: task 0: Exited\n")
    fake_slurm(31, "FAILED", reason="NonZeroExitCode", exit_code="16:0", log=str(log))
    assert not jobs.active(31)
    message = jobs.diagnose(31)
    assert message.startswith("Slurm job 31 (hpclab-engines) FAILED with exit code 16 after 00:00:42 on gpu07: ")
    assert cause in message and fix in message and message.endswith(f"Log: {log}"), message
    assert "\n" not in message


def test_ended_jobs_without_a_known_line(fake_slurm, tmp_path):
    log = tmp_path / "job.log"
    log.write_text("Traceback (most recent call last):\nRuntimeError: the answer is wrong\n")
    fake_slurm(41, "FAILED", exit_code="1:0", log=str(log))
    assert "the job's program failed (log says: 'RuntimeError: the answer is wrong')" in jobs.diagnose(41)
    fake_slurm(42, "CANCELLED", exit_code="0:15")
    assert "was cancelled" in jobs.diagnose(42)
    fake_slurm(43, "TIMEOUT", exit_code="0:0")
    assert "reached its time limit 01:00:00" in jobs.diagnose(43)
    fake_slurm(44, "COMPLETED")
    assert "ended normally" in jobs.diagnose(44)


def test_old_jobs_come_from_sacct_and_unknown_ones_are_said_so(fake_slurm):
    (fake_slurm.state / "sacct_51").write_text("51|hpclab-engines|FAILED|9:0|gpu03|00:10:00|01:00:00|gpu\n")
    info = jobs.info(51)  # (scontrol does not know it: what is known comes from sacct)
    assert (info.state, info.exit_code, info.nodes, info.partition) == ("FAILED", 9, "gpu03", "gpu")
    assert "not known to scontrol or sacct" in jobs.report(52)
    assert "not known to scontrol or sacct" in jobs.diagnose(52) and not jobs.active(52)


def test_the_job_of_a_cluster_comes_from_its_engine_set_or_its_controller():
    class Launcher:
        def __init__(self, job_id=""):
            self.job_id = job_id

    class Cluster:
        engines = {"1": Launcher("77")}
        controller = Launcher()

    assert jobs.job_of(Cluster) == "77"
    Cluster.engines, Cluster.controller = {}, Launcher("78")
    assert jobs.job_of(Cluster) == "78"
    Cluster.controller = None
    assert jobs.job_of(Cluster) is None
    assert jobs.job_of(raw={"engines": {"sets": {"1": {"job_id": "79"}}}}) == "79"


def test_waiting_for_an_engine_job_says_each_state_once_and_stops_when_it_ends(fake_slurm, tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "POLL_S", 0)
    job = jobs.EngineJob("61")
    fake_slurm(61, "PENDING", reason="Priority", nodes="(null)")
    assert job.check() == "Slurm job 61 (hpclab-engines) PENDING (Priority)"
    assert job.text == "Slurm job 61 PENDING (Priority)"  # the progress bar's
    assert job.check() is None  # unchanged: said once
    fake_slurm(61, "RUNNING")
    assert job.check() == "Slurm job 61 (hpclab-engines) RUNNING on gpu07 for 00:00:42"
    log = tmp_path / "e.log"
    log.write_text("Abort(...) Runtime environment uses unsupported PMI version PMIx. Aborting.\n")
    fake_slurm(61, "FAILED", exit_code="16:0", log=str(log))
    with pytest.raises(jobs.JobEnded, match=r"^Slurm job 61 \(hpclab-engines\) FAILED .*pmi2.* Log: "):
        job.check()


def test_an_engine_job_still_queued_at_the_deadline_is_said_so_with_the_reason(fake_slurm, tmp_path):
    fake_slurm(62, "PENDING", reason="Resources", nodes="(null)", log=str(tmp_path / "e.log"))
    message = jobs.EngineJob("62").at_deadline("only 0 of 4 engines registered in 600 s")
    assert message.startswith("only 0 of 4 engines registered in 600 s; Slurm job 62 (hpclab-engines) PENDING "
                              "(Resources): waiting for free GPUs/nodes. Fix: "), message
    assert f"Log: {tmp_path}/e.log. The job is cancelled now" in message and "timeout=" in message


def test_connect_on_a_login_node_refuses_to_start_local_engines(login_node, monkeypatch):
    import ipyparallel as ipp

    pdir = login_node / "ipython" / "profile_default"
    pdir.mkdir(parents=True)
    plan = ipp.Cluster(profile_dir=str(pdir), load_profile=False)
    with pytest.raises(guard.ClusterError, match="no engines were started: this looks like a Slurm login node"):
        guard.plan(plan, 4)
    assert init(login_node, monkeypatch, "--slurm", "-p", "gpu", "--gpus-per-node", "4", "--mpi", "pmi2").returncode == 0
    assert guard.plan(plan, 4) == ("4 engines as one Slurm job (partition gpu, 4 GPUs per node, time 01:00:00, "
                                   "srun --mpi=pmi2 --kill-on-bad-exit=1)")


def test_inside_a_job_with_gpus_the_engines_are_an_srun_step_of_that_job(tmp_path, monkeypatch):
    import ipyparallel as ipp
    from ipyparallel.cluster.launcher import MPIEngineSetLauncher

    for name, value in (("SLURM_JOB_ID", "77"), ("SLURM_GPUS_ON_NODE", "4"), ("SLURM_JOB_NUM_NODES", "2"),
                        ("HPCLAB_SRUN_MPI", "pmi2"), (guard.ALLOW, "0")):
        monkeypatch.setenv(name, value)
    (tmp_path / prof.SETTINGS_FILE).write_text("{}")  # even with a Slurm profile: no second job
    cluster = ipp.Cluster(profile_dir=str(tmp_path), load_profile=False)
    assert guard.plan(cluster, 4) == ("4 MPI engines in this Slurm job 77 (srun --mpi=pmi2 --kill-on-bad-exit=1 "
                                      "--overlap -n 4, one rank per GPU); no second job")
    launcher = cluster.engine_launcher_class(parent=cluster, profile_dir=str(tmp_path), cluster_id="")
    assert isinstance(launcher, MPIEngineSetLauncher) and launcher.mpi_cmd == [*flavour.srun_command("pmi2"), "--overlap"]
    assert cluster.controller_ip == "*"  # two nodes: ranks on the other node reach the controller here
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "2")
    assert "4 ranks on its 2 GPUs of this node" in guard.plan(cluster, 4)
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")  # salloc's shell has only what was asked for
    monkeypatch.setenv("SLURM_GPUS_PER_NODE", "h100:4")
    assert guard.job_gpus() == 4
    monkeypatch.setenv(guard.ALLOW, "1")  # the test suite's own engines stay local
    assert guard.plan(ipp.Cluster(profile_dir=str(tmp_path / "x"), load_profile=False), 4) == \
        "4 MPI engines on this machine (mpiexec)"


def test_a_running_job_says_how_long_it_has_left(fake_slurm):
    from datetime import datetime, timedelta

    fake_slurm(81, "RUNNING")
    info = jobs.info(81)
    info.end = (datetime.now() + timedelta(minutes=95, seconds=30)).isoformat(timespec="seconds")
    assert info.left() == "1:35 left"
    info.state = "PENDING"
    assert info.left() == ""


# ---------------------------------------------------------------- when the Slurm tier cannot run

def test_the_slurm_tier_says_in_one_line_why_it_cannot_run(monkeypatch, tmp_path):
    from . import slurm_local

    monkeypatch.delenv("HPCLAB_SLURM_TIER", raising=False)        # make test-gpu turns the tier off
    monkeypatch.setattr(slurm_local.os, "geteuid", lambda: 1000)
    assert slurm_local.unavailable() == ("the Slurm tier needs root (it runs slurmctld, slurmd and munged in a "
                                         "network namespace)")
    monkeypatch.setattr(slurm_local.os, "geteuid", lambda: 0)
    monkeypatch.setattr(slurm_local, "_installed", lambda: False)
    monkeypatch.setenv("PATH", str(fake_bin(tmp_path, ip="exit 0\n", nsenter="exit 0\n")))
    assert slurm_local.unavailable() == ("Slurm is not installed and there is no apt-get to install slurm-wlm "
                                         "and munge")
