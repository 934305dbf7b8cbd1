"""Communication backends, the all-reduce measurement, and Exercises 3 and 4.

On the simulator: mpi-host is the backend the simulator really has; mpi-cuda
runs its real code path there with HPCLAB_MPI_CUDA_AWARE=1, because simulated
device memory is host memory. On a GPU (make test-gpu) the backends that run
there are checked the same way, nccl among them when every rank has a GPU of
its own. Ranks that share a GPU (every rank of a node on the simulator; more
ranks than GPUs on a GPU node) must never reach NCCL: auto takes another
backend and says why once, an explicit nccl is refused on every rank.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from .helpers import ROOT, env, gpus, last_json, launcher, run_hpclab, run_mpi

OPS_SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "comm_ops.py")


def run_ops(n: int, *args: str, timeout: float = 90, **extra_env) -> subprocess.CompletedProcess:
    cmd = [*launcher(), "-n", str(n), sys.executable, OPS_SCRIPT, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**extra_env), cwd=ROOT)


# -- every operation of every backend against NumPy ------------------------------------
@pytest.mark.requires_sim("mpi-cuda is run on simulated device memory, which is host memory; on a GPU "
                          "a non-CUDA-aware MPI given device pointers would crash")
@pytest.mark.parametrize("n", [2, 3])
def test_every_op_matches_numpy(n):
    proc = run_ops(n, "auto,mpi-host,mpi-cuda", HPCLAB_MPI_CUDA_AWARE=1)
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["backend"] for r in reports] == ["mpi-host", "mpi-host", "mpi-cuda"]
    for r in reports:
        wrong = [op for op, ok in r["results"].items() if not ok]
        assert not wrong, f"{r['backend']} on {n} ranks: {wrong}"
        assert len(r["results"]) == 45  # 15 checks x 3 dtypes: nothing skipped
    # auto says plainly, once, why it chose mpi-host on the simulator
    said = [ln for ln in proc.stderr.splitlines() if "hpclab communication backend" in ln]
    assert len(said) == 1 and "mpi-host" in said[0] and "simulator" in said[0]


@pytest.mark.requires_gpu("device buffers in GPU memory")
def test_every_op_of_the_gpu_backends_matches_numpy():
    """mpi-host and auto on 2 ranks; nccl too where each rank has a GPU of its own."""
    own = gpus() >= 2
    proc = run_ops(2, "auto,mpi-host" + (",nccl" if own else ""), timeout=180)
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert reports[0]["backend"] == "nccl" if own else reports[0]["backend"] in ("mpi-host", "mpi-cuda")
    for r in reports:
        wrong = [op for op, ok in r["results"].items() if not ok]
        assert not wrong and len(r["results"]) == 45, f"{r['backend']}: {wrong}"


# -- ranks sharing a GPU: never NCCL ------------------------------------------------------
@pytest.mark.requires_shared_gpu(2)
def test_auto_on_a_shared_gpu_avoids_nccl_and_says_why_once():
    proc = run_mpi(2, "run", "collectives", "--json", timeout=90)
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "hpclab communication backend" in ln]
    assert len(said) == 1, proc.stderr                                   # rank 0, once
    assert "share GPU 0" in said[0] and "NCCL needs one GPU per rank" in said[0]
    assert said[0].split(":")[1].split(",")[0].strip() in ("mpi-host", "mpi-cuda")
    assert last_json(proc)["ranks_per_gpu"] == 2


@pytest.mark.requires_shared_gpu(2)
def test_explicit_nccl_on_a_shared_gpu_is_refused_on_every_rank():
    t0 = time.monotonic()
    proc = run_mpi(2, "run", "collectives", "--backend", "nccl", timeout=60)
    assert proc.returncode != 0
    # every rank says it (their stderr lines may interleave, so count the messages)
    assert "[rank 0] error:" in proc.stderr and "[rank 1] error:" in proc.stderr
    for said in ("ranks 0, 1 share GPU 0", "NCCL needs one GPU per rank",   # the ranks, the GPU, why
                 "--backend auto or mpi-host", "one rank per GPU"):         # the alternatives
        assert proc.stderr.count(said) == 2, (said, proc.stderr)
    assert "NCCL_ERROR" not in proc.stderr and "Traceback" not in proc.stderr   # NCCL never touched
    assert time.monotonic() - t0 < 45


@pytest.mark.requires_gpu_per_rank(2)
def test_auto_with_a_gpu_per_rank_takes_nccl():
    proc = run_mpi(2, "run", "collectives", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "hpclab communication backend" in ln]
    assert len(said) == 1 and "backend: nccl, because GPUs and NCCL on every rank" in said[0], proc.stderr
    assert last_json(proc)["ranks_per_gpu"] == 1


def test_shared_gpu_decision_with_injected_uuids():
    """2 GPUs, 4 ranks (GPU = local rank mod 2): ranks 0, 2 share one, ranks 1, 3 the other."""
    from hpclab.comm.nccl import SharedGPUError
    from hpclab.comm.select import decide
    from hpclab.device import shared_devices

    everyone = [(f"GPU-{'ab'[r % 2]}", "node1", r % 2, "NVIDIA H100") for r in range(4)]
    shared = shared_devices(everyone)
    assert [(g.ranks, g.gpu, g.uuid) for g in shared] == [([0, 2], 0, "GPU-a"), ([1, 3], 1, "GPU-b")]
    name, why = decide(shared, simulator=False, nccl_ok=True, nccl_why="NCCL 2.28.9",
                       aware=False, how="MPIX_Query_cuda_support() = 0")
    assert name == "mpi-host"
    assert "ranks 0, 2 share GPU 0 of node1 (NVIDIA H100, GPU-a)" in why
    assert "ranks 1, 3 share GPU 1 of node1 (NVIDIA H100, GPU-b)" in why
    assert "NCCL needs one GPU per rank" in why and "not CUDA-aware" in why
    assert decide(shared, False, True, "", True, "forced")[0] == "mpi-cuda"
    # one GPU per rank: NCCL; the simulator: host staging
    assert decide([], False, True, "NCCL 2.28.9", False, "")[0] == "nccl"
    assert decide([], True)[0] == "mpi-host"
    err = SharedGPUError(shared, 4)
    assert str(err).startswith("NCCL backend failed on rank 0, 1, 2, 3 of 4: ranks 0, 2 share GPU 0")
    assert sorted(err.failures) == [0, 1, 2, 3] and "(and " not in str(err)
    for alternative in ("--backend auto or mpi-host", "mpi-cuda", "one rank per GPU"):
        assert alternative in str(err)


# -- bad input: a clear message on every rank, non-zero exit, within seconds -------------
def test_mismatched_buffers_name_the_rank():
    proc = run_ops(3, "mismatch", "mpi-host", timeout=30)
    assert proc.returncode != 0
    # every rank says it (ranks' stderr lines may interleave, so count the messages)
    said = "allreduce failed on rank 1 of 3: buffer (5,) float64 but rank 0 has (4,) float64"
    assert proc.stderr.count(said) == 3, proc.stderr


def test_unknown_backend_name():
    proc = run_mpi(2, "run", "collectives", "--backend", "carrier-pigeon", timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.count("argument --backend: invalid choice: 'carrier-pigeon'") == 1, proc.stderr
    assert "mpi-host" in proc.stderr and "nccl" in proc.stderr  # the choices are named


def test_mpi_cuda_on_a_non_aware_mpi_is_refused():
    proc = run_mpi(2, "run", "collectives", "--backend", "mpi-cuda", timeout=30, HPCLAB_MPI_CUDA_AWARE=0)
    assert proc.returncode != 0
    assert "not CUDA-aware" in proc.stderr and "mpi-host" in proc.stderr


@pytest.mark.requires_shared_gpu(3)
def test_nccl_bootstrap_check_tells_right_from_wrong():
    """Notebook 05's exercise check, on the recording stand-in for NCCL that serves where NCCL
    cannot run (the simulator; ranks sharing a GPU). With a GPU per rank the wrong bootstraps
    would leave real NCCL waiting for ids that never come."""
    cmd = [*launcher(), "-n", "3", sys.executable, str(ROOT / "tests" / "mpi_scripts" / "nccl_bootstrap.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    v = last_json(proc)
    assert v["right"][0] is True and v["right_bytes"][0] is True
    assert v["own_ids"][0] is False and "only rank 0 should call get_unique_id()" in v["own_ids"][1]
    assert v["not_broadcast"][0] is False and "ranks [1, 2] hold a different id" in v["not_broadcast"][1]
    assert v["wrong_rank"][0] is False and "rank 1 created NcclCommunicator(3, the id, 0)" in v["wrong_rank"][1]
    # on GPUs, the wrong bootstraps end on every rank with the mistake named, before NCCL could wait forever
    assert v["guarded_own_ids"][0] is False and "NcclCommunicator would wait forever: ranks [1, 2] brought another " \
        "id than rank 0's" in v["guarded_own_ids"][1] and "rank 0 raised RuntimeError" in v["guarded_own_ids"][1]
    assert v["guarded_not_broadcast"][0] is False and "ranks [1, 2]" in v["guarded_not_broadcast"][1]
    assert v["guarded_wrong_rank"][0] is False and "rank 1 asked for (3 ranks, rank 0)" in v["guarded_wrong_rank"][1]
    assert not any(v[f"guarded_{k}_reached_nccl"][0] for k in ("own_ids", "not_broadcast", "wrong_rank"))


def test_size_parsing_and_bus_bandwidth():
    from hpclab.comm.measure import busbw_factor, parse_size

    assert [parse_size(s) for s in ("4", "1K", "1M", "256M", "1G", "64KiB")] == \
        [4, 1024, 1 << 20, 256 << 20, 1 << 30, 64 << 10]
    assert busbw_factor(2) == 1.0 and busbw_factor(4) == 1.5 and busbw_factor(1) == 1.0


# -- Exercises 3 and 4 (use hpclab.pi.fast.count_hits) ------------------------------------------
def test_exercises_3_and_4_agree_for_any_split():
    """The total depends only on (samples, seed): 1 or 3 'GPUs' in one process (on a GPU node,
    1 and all of its GPUs), 2 or 3 ranks. Hit counts are integers: equal exactly."""
    args = ("--samples", "3000", "--seed", "11", "--json")
    several = 3 if gpus() == 0 else gpus()          # the simulator counts any number of shares
    results = [last_json(run_hpclab("run", "pi-nccl-node", "--gpus", "1", *args, timeout=90)),
               last_json(run_hpclab("run", "pi-nccl-node", "--gpus", str(several), *args, timeout=90)),
               last_json(run_mpi(2, "run", "pi-nccl-mpi", *args, timeout=90)),
               last_json(run_mpi(3, "run", "pi-nccl-mpi", *args, timeout=90))]
    for out in results:
        assert out["passed"] is True
        assert out["result"]["samples"] == 3000
    assert len({out["result"]["hits"] for out in results}) == 1
    assert results[1]["result"]["gpus"] == several and sum(results[1]["result"]["per_gpu_hits"]) == \
        results[1]["result"]["hits"]
    # NCCL with a GPU per rank; host-staged MPI where ranks share one (or on the simulator)
    for out, ranks in ((results[2], 2), (results[3], 3)):
        own = out["backend"] == "gpu" and gpus() >= ranks
        assert out["result"]["comm_backend"] == ("nccl" if own else "mpi-host")
    assert len(results[3]["result"]["per_rank_hits"]) == 3


def test_exercise_3_refuses_several_ranks():
    proc = run_mpi(2, "run", "pi-nccl-node", "--samples", "100", timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("ONE process") == 1, proc.stderr


@pytest.mark.requires_shared_gpu(2)
def test_exercise_4_on_a_shared_gpu_falls_back_unless_nccl_is_asked_for():
    proc = run_mpi(2, "run", "pi-nccl-mpi", "--samples", "100", "--json", timeout=60)
    out = last_json(proc)
    assert out["passed"] and out["result"]["comm_backend"] == "mpi-host"
    if out["backend"] == "gpu":                    # on the simulator the note is about the simulator
        assert "share GPU 0" in proc.stdout and "one rank per GPU" in proc.stdout
    proc = run_mpi(2, "run", "pi-nccl-mpi", "--backend", "nccl", "--samples", "100", timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("NCCL needs one GPU per rank") == 2, proc.stderr     # on every rank
