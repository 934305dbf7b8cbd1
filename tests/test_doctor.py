"""hpclab doctor: each requirement's line from given facts, and the command end to end (here,
under mpiexec, and on engines), with broken requirements made to FAIL with their fix."""
import os
import re
import subprocess
import sys

import pytest

from hpclab.cli import doctor
from hpclab.device import SharedGPU

from .helpers import ROOT, env, launcher, run_hpclab

LINE = re.compile(r"^(PASS|WARN|FAIL|SKIP)  [\w ./-]+: ")
SHARED = [SharedGPU([0, 1], "node1", 0, "NVIDIA H100 80GB HBM3", "GPU-1234")]
MPICH = "MPICH Version:      4.3.1\nMPICH Release date: ...\n"
OPENMPI = "Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023"


def _lines(stdout: str) -> dict[str, str]:
    """requirement -> its line, from the doctor's output; every line of it has the agreed shape."""
    found = [ln for ln in stdout.splitlines() if LINE.match(ln)]
    assert found, stdout
    return {ln.split(":", 1)[0][6:]: ln for ln in found}


# --- each requirement from facts ------------------------------------------------------------

def test_numpy_2_5_fails_with_the_pin_that_fixes_it():
    line = doctor.numpy_line("2.5.2")
    assert line.status == "FAIL" and "cannot compile kernels with numpy 2.5" in line.found
    assert line.fix == "pip install 'numpy<2.5'"
    assert doctor.numpy_line("2.4.6").status == doctor.numpy_line("1.26.4").status == "PASS"
    assert doctor.numpy_line("2.10.0").status == "FAIL"


def test_cupy_built_for_a_newer_cuda_than_the_driver_fails_with_the_matching_wheel():
    line = doctor.cupy_line({"cupy-cuda13x": "14.2.0"}, (12, 4), simulator=False)
    assert line.status == "FAIL"
    assert line.found == "cupy-cuda13x 14.2.0, built for CUDA 13, but the driver supports 12.4"
    assert line.fix == "pip uninstall -y cupy-cuda13x && pip install cupy-cuda12x"
    assert doctor.cupy_line({"cupy-cuda12x": "14.2.0"}, (13, 0), simulator=False).status == "PASS"
    assert doctor.cupy_line({"cupy-cuda13x": "14.2.0"}, (13, 0), simulator=False).status == "PASS"
    both = doctor.cupy_line({"cupy-cuda12x": "14.2.0", "cupy-cuda13x": "14.2.0"}, (13, 0), simulator=False)
    assert both.status == "FAIL" and both.fix == "pip uninstall -y cupy-cuda12x"


def test_missing_cupy_fails_on_a_gpu_and_is_skipped_on_the_simulator():
    line = doctor.cupy_line({}, (12, 4), simulator=False)
    assert line.status == "FAIL" and "no NCCL" in line.found and line.fix.startswith("pip install cupy-cuda12x")
    assert doctor.cupy_line({}, None, simulator=True).status == "SKIP"
    assert doctor.cupy_line({"cupy-cuda13x": "14.2.0"}, None, simulator=True).status == "SKIP"


def test_the_driver_must_support_cuda_12_or_13():
    assert doctor.driver_line((12, 4), simulator=False).status == "PASS"
    old = doctor.driver_line((11, 8), simulator=False)
    assert old.status == "FAIL" and "needs CUDA 12 or 13" in old.found and old.fix
    assert doctor.driver_line(None, simulator=True).status == "SKIP"
    assert doctor.driver_line(None, simulator=False).status == "FAIL"


def test_ranks_sharing_a_gpu_fail_only_when_nccl_is_asked_for():
    line = doctor.sharing_line(SHARED, 2, simulator=False, asked="nccl")
    assert line.status == "FAIL" and "ranks 0, 1 share GPU 0 of node1" in line.found
    assert "one engine per GPU" in line.fix
    assert doctor.sharing_line(SHARED, 2, simulator=False, asked="auto").status == "WARN"
    assert doctor.sharing_line(SHARED, 2, simulator=True, asked="auto").status == "SKIP"
    assert doctor.sharing_line(SHARED, 2, simulator=True, asked="nccl").status == "FAIL"
    assert doctor.sharing_line([], 4, simulator=False, asked="nccl").status == "PASS"


def test_mpi_that_is_not_cuda_aware_warns_and_fails_when_mpi_cuda_is_asked_for():
    how = "MPIX_Query_cuda_support() = 0"
    assert doctor.aware_line(False, how, simulator=False, asked="auto").status == "WARN"
    strict = doctor.aware_line(False, how, simulator=False, asked="mpi-cuda")
    assert strict.status == "FAIL" and "staged through host memory" in strict.found and strict.fix
    yes = doctor.aware_line(True, "MPIX_Query_cuda_support() = 1", simulator=False, asked="mpi-cuda")
    assert yes.status == "PASS"
    assert doctor.aware_line(False, "", simulator=True, asked="auto").status == "SKIP"


def test_an_mpiexec_of_another_mpi_fails():
    """MPICH's mpiexec starting mpi4py built on Open MPI gives every rank a world of one."""
    wrong = doctor.mpi_line(OPENMPI, "/usr/bin/mpiexec", "HYDRA build details:\n    Version: 4.3.1\n")
    assert wrong.status == "FAIL" and "world of one" in wrong.found
    assert doctor.mpi_line(MPICH, "/x/mpiexec", "HYDRA build details:\n").status == "PASS"
    assert doctor.mpi_line(OPENMPI, "/usr/bin/mpiexec", "mpiexec (OpenRTE) 4.1.6\n").status == "PASS"
    assert doctor.mpi_line(MPICH, None, "").status == "WARN"


def test_srun_mpi_flavour_against_what_srun_offers():
    assert doctor.srun_line(MPICH, None).status == "SKIP"
    line = doctor.srun_line(MPICH, ["pmi2", "pmix", "none"])
    assert line.status == "PASS" and "srun --mpi=pmi2" in line.found
    line = doctor.srun_line(MPICH, ["pmix", "none"])
    assert line.status == "FAIL" and "srun here offers only pmix, none" in line.found and line.fix
    assert doctor.srun_line(MPICH, "`srun --mpi=list` gave no list (fatal)").status == "WARN"


def test_nccl_asked_for_on_the_simulator_fails_and_is_skipped_otherwise():
    asked = doctor.nccl_line(simulator=True, asked=True, driver=None)
    assert asked.status == "FAIL" and asked.fix
    assert doctor.nccl_line(simulator=True, asked=False, driver=None).status == "SKIP"


def test_lines_that_differ_between_ranks_name_their_ranks():
    a, b = doctor.Line("PASS", "numpy", "2.4.6"), doctor.Line("FAIL", "numpy", "2.5.0", "pip install 'numpy<2.5'")
    assert doctor.merge([[a], [a]]) == [str(a)]
    assert doctor.merge([[a], [b], [a]]) == [f"{a}  [ranks 0, 2]", f"{b}  [rank 1]"]


# --- the command ------------------------------------------------------------------------------

def test_healthy_here_every_line_passes_or_says_why_not():
    proc = run_hpclab("doctor", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = _lines(proc.stdout)
    assert "FAIL" not in proc.stdout
    for what in ("backend", "NVIDIA driver", "numpy", "numba-cuda kernel", "CuPy", "NCCL", "MPI", "srun --mpi",
                 "CUDA-aware MPI"):
        assert what in lines, proc.stdout


@pytest.mark.requires_sim("the GPU lines say SKIP only on the simulator")
def test_on_the_simulator_the_gpu_lines_say_skip_and_why():
    lines = _lines(run_hpclab("doctor", timeout=120).stdout)
    assert lines["backend"].startswith("WARN") and "Numba CUDA simulator" in lines["backend"]
    for what in ("numba-cuda kernel", "CuPy", "NCCL", "CUDA-aware MPI"):
        assert lines[what].startswith("SKIP") and "simulator" in lines[what], lines[what]


@pytest.mark.requires_gpu("the GPU lines PASS only on a GPU")
def test_on_a_gpu_the_kernel_and_nccl_lines_pass():
    lines = _lines(run_hpclab("doctor", timeout=180).stdout)
    for what in ("backend", "NVIDIA driver", "numba-cuda kernel", "CuPy", "NCCL"):
        assert lines[what].startswith("PASS"), lines[what]


def _shadowing(tmp_path, name: str, files: dict[str, str]) -> str:
    """A folder put first on PYTHONPATH that holds ``files`` (a fake package or dist-info)."""
    folder = tmp_path / name
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return f"{folder}{os.pathsep}{env()['PYTHONPATH']}"


def test_numpy_too_new_fails_with_its_fix_and_exit_status_1(tmp_path):
    path = _shadowing(tmp_path, "new-numpy", {"numpy-2.5.0.dist-info/METADATA":
                                              "Metadata-Version: 2.1\nName: numpy\nVersion: 2.5.0\n"})
    proc = run_hpclab("doctor", timeout=120, PYTHONPATH=path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _lines(proc.stdout)["numpy"] == ("FAIL  numpy: 2.5.0: numba-cuda 0.30 cannot compile kernels with "
                                            "numpy 2.5 (it has no numpy.row_stack)  -> fix: pip install 'numpy<2.5'")


def test_hidden_nccl_fails_with_its_fix_when_nccl_is_asked_for(tmp_path):
    path = _shadowing(tmp_path, "no-cupy", {"cupy/__init__.py": "raise ImportError('CuPy hidden by the test')\n"})
    proc = run_hpclab("doctor", "--backend", "nccl", timeout=120, PYTHONPATH=path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = _lines(proc.stdout)["NCCL"]
    assert line.startswith("FAIL  NCCL: cupy.cuda.nccl does not import (ImportError: CuPy hidden by the test)")
    assert "-> fix: pip install cupy-cuda1" in line and "nvidia-nccl-cu1" in line


def test_a_wrong_option_is_refused_with_exit_status_2():
    proc = run_hpclab("doctor", "--backend", "carrier-pigeon", timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'carrier-pigeon'" in proc.stderr


@pytest.mark.mpi
@pytest.mark.requires_shared_gpu(2)
def test_two_ranks_on_one_gpu_fail_when_nccl_is_asked_for():
    cmd = [*launcher(), "-n", "2", sys.executable, "-m", "hpclab", "doctor", "--backend", "nccl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env(), cwd=ROOT)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    line = _lines(proc.stdout)["GPUs per rank"]
    assert line.startswith("FAIL") and "share GPU" in line and "-> fix: one engine per GPU" in line
    assert proc.stdout.count("PASS  numpy") == 1          # rank 0 speaks for both


@pytest.mark.notebooks
def test_on_engines_every_rank_is_checked_and_nccl_on_a_shared_gpu_fails(tmp_path):
    e = env(IPYTHONDIR=str(tmp_path / "ipython"))
    run = [sys.executable, "-m", "hpclab", "doctor", "--engines", "-n", "2"]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=240, env=e, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hpclab doctor on 2 engines" in proc.stdout and "GPUs per rank" in _lines(proc.stdout)
    assert "FAIL" not in proc.stdout and "stopped this notebook's 2 engines" in proc.stdout
    if doctor.backend.select() == "sim" or doctor.backend.count_gpus() < 2:
        proc = subprocess.run([*run, "--backend", "nccl"], capture_output=True, text=True, timeout=240, env=e,
                              cwd=ROOT)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert _lines(proc.stdout)["GPUs per rank"].startswith("FAIL  GPUs per rank: ranks 0, 1 share GPU 0")


@pytest.mark.notebooks
def test_engines_that_cannot_start_are_a_fail_line_with_exit_status_1(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(
        "import sys\nif 'ipyparallel.engine' in ' '.join(getattr(sys, 'orig_argv', sys.argv)):\n"
        "    sys.stderr.write('this engine cannot start: libfoo.so missing\\n')\n    raise SystemExit(1)\n")
    e = env(IPYTHONDIR=str(tmp_path / "ipython"), PYTHONPATH=f"{broken}{os.pathsep}{env()['PYTHONPATH']}")
    proc = subprocess.run([sys.executable, "-m", "hpclab", "doctor", "--engines", "-n", "2"], capture_output=True,
                          text=True, timeout=120, env=e, cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  engines: 2 MPI engines did not start" in proc.stdout and "libfoo.so missing" in proc.stdout


# --- hpclab doctor --site: the site's Slurm from its commands' output ----------------------

def test_site_reads_slurm_times_and_gpu_gres():
    from hpclab.cli import site

    assert [site.minutes(t) for t in ("45", "30:00", "8:00:00", "1-12", "1-02:00:00")] == [45, 30, 480, 2160, 1560]
    assert site.minutes("INFINITE") == site.minutes("UNLIMITED") == float("inf")
    assert [site.gpus_of(g) for g in ("gpu:4", "gpu:a100:4(S:0-1),shard:8", "gpu:a100:2,gpu:v100:2", "(null)")] \
        == [4, 4, 4, 0]


SINFO = "n1|gpu:a100:4(S:0-1)|idle|up|12:00:00\nn2|gpu:a100:4|mixed|up|12:00:00\nn3|gpu:a100:4|drained|up|12:00:00\n"


def test_site_partition_line_counts_usable_nodes_and_checks_gpus_and_time():
    from hpclab.cli import site

    line, usable = site.partition_line(SINFO, "gpu", 4, "08:00:00")
    assert line.status == "PASS" and usable == {"n1": 4, "n2": 4}
    assert line.found == "up; 3 nodes (2 usable) with 4 GPUs each; time limit 12:00:00"
    big = site.partition_line(SINFO, "gpu", 8, "08:00:00")[0]
    assert big.status == "FAIL" and big.fix == "--gpus-per-node 4 at most"
    long = site.partition_line(SINFO, "gpu", 4, "1-00:00:00")[0]
    assert long.status == "WARN" and long.fix.startswith("--time 12:00:00 at most")
    assert site.partition_line("", "gpu", 4, "08:00:00")[0].status == "FAIL"
    assert "it is down" in site.partition_line(SINFO.replace("|up|", "|down|"), "gpu", 4, "1:00:00")[0].found


RESERVATION = ("ReservationName=day StartTime=2026-12-03T08:30:00 EndTime=2026-12-03T17:00:00 Duration=08:30:00 "
               "Nodes=n[1-2] NodeCnt=2 CoreCnt=128 Features=(null) PartitionName=gpu Flags= TRES=cpu=128 "
               "Users=(null) Groups=(null) Accounts=ws2026 Licenses=(null) State=INACTIVE BurstBuffer=(null)")


def test_site_reservation_line_names_its_nodes_and_whom_it_admits():
    from hpclab.cli import site

    line, nodes = site.reservation_line(RESERVATION, "day", "gpu", "alice", "ws2026")
    assert line.status == "PASS" and nodes == ["n[1-2]"]
    assert "inactive, 2026-12-03T08:30:00 to 2026-12-03T17:00:00 on 2 nodes" in line.found
    assert "accounts ws2026" in line.found
    other = site.reservation_line(RESERVATION, "day", "gpu", "alice", "")[0]
    assert other.status == "WARN" and "not you (alice" in other.found
    wrong = site.reservation_line(RESERVATION, "day", "gpu-long", "alice", "ws2026")[0]
    assert wrong.status == "FAIL" and wrong.fix == "--partition gpu"
    missing = site.reservation_line("Reservation day not found", "day", "gpu", "alice", "")
    assert missing[0].status == "FAIL" and missing[1] == []


def test_site_room_line_fits_one_job_per_learner_on_the_usable_nodes():
    from hpclab.cli import site

    assert site.room_line(4, 4, {"n1": 8, "n2": 8}, "partition gpu").status == "PASS"
    short = site.room_line(4, 20, {"n1": 8, "n2": 4, "n3": 2}, "reservation day")
    assert short.status == "WARN" and "room for 3 such jobs" in short.found and "--gpus-per-node 2" in short.fix


ASSOC = "ws2026|||gres/gpu=64|gres/gpu=8|\nws2026|gpu|normal,workshop|||\n"
QOS = "normal||||\nworkshop|gres/gpu=2|||\nother|gres/gpu=1|||\n"


def test_site_limits_line_fails_a_gpu_limit_below_one_engines_job():
    from hpclab.cli import site

    low = site.limits_line(0, ASSOC, QOS, 4)
    assert low.status == "FAIL" and "QOS workshop MaxTRESPerUser gres/gpu=2" in low.found
    assert "QOS other" not in low.found and low.fix.startswith("--gpus-per-node 2")
    assert site.limits_line(0, ASSOC, QOS.replace("gres/gpu=2", "gres/gpu=4"), 4).status == "PASS"
    assert site.limits_line(0, "ws2026|||||\n", "", 4).status == "PASS"
    assert site.limits_line(0, "", "", 4).status == "WARN"
    none = site.limits_line(1, "sacctmgr: error: Problem talking to the database: Connection refused", "", 4)
    assert none.status == "SKIP" and "Problem talking to the database" in none.found


def test_site_test_submission_line_quotes_slurm():
    from hpclab.cli import site

    ok = site.test_submission_line(0, "sbatch: Job 42 to start at 2026-12-03T08:30:00 using 4 processors on nodes "
                                      "n1 in partition gpu")
    assert ok.status == "PASS" and "Job 42 to start at 2026-12-03T08:30:00" in ok.found
    bad = site.test_submission_line(1, "sbatch: error: Batch job submission failed: Invalid account or "
                                       "account/partition combination specified")
    assert bad.status == "FAIL" and "Invalid account" in bad.found


def test_site_without_slurm_says_so_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hpclab", "doctor", "--site", "-p", "gpu"], capture_output=True,
                          text=True, env=env(PATH=str(tmp_path)), cwd=ROOT, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL  Slurm: ") and len(proc.stdout.splitlines()) == 1
    no_partition = subprocess.run([sys.executable, "-m", "hpclab", "doctor", "--site"], capture_output=True, text=True,
                                  env=env(), cwd=ROOT, timeout=60)
    assert no_partition.returncode == 2 and "--site needs --partition" in no_partition.stderr
