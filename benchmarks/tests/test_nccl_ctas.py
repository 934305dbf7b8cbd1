"""``python -m benchmarks ddp --overlap-ctas``: the NCCL communicator of few CTAs for the hidden all-reduces."""
import ctypes
import subprocess
import sys

import pytest

from tests.helpers import ROOT, env, gpus, last_json, launcher, run_benchmark


def test_cta_limited_communicator_config_and_limits():
    """The ncclConfig_t handed to NCCL: the 2.17 layout (size, magic, version, then the CTA limits); NCCL
    reads ``size`` bytes of it. Bad limits are refused before NCCL is touched, on any backend."""
    from hpclab.ddp import MLP
    from hpclab.ddp.trainer import DDPTrainer
    from hpclab.mpi import world

    from benchmarks.nccl_ctas import HiddenAllreduce, config

    cfg = config(8)
    raw = bytes(cfg)
    assert cfg.size == len(raw) == 32 and ctypes.c_size_t.from_buffer_copy(raw[:8]).value == 32
    assert raw[8:12] == (0xCAFEBEEF).to_bytes(4, "little") and int.from_bytes(raw[12:16], "little") == 21700
    assert [int.from_bytes(raw[i:i + 4], "little", signed=True) for i in range(16, 32, 4)] == [-2 ** 31, -2 ** 31, 1, 8]
    for bad in (0, 65, 2.0):
        with pytest.raises(ValueError, match="max_ctas"):
            config(bad)
        with pytest.raises(ValueError, match="max_ctas"):
            HiddenAllreduce(bad)
    # MPI runs no kernels of its own: the limit does not apply, and the trainer keeps the backend's all-reduce.
    hidden = HiddenAllreduce(4)
    trainer = DDPTrainer(MLP([4, 3, 2]), world(), "mpi-host", overlap=True, bucket_mb=1e-6, hidden_allreduce=hidden)
    assert len(trainer.buckets) > 1 and trainer.hidden_allreduce is None and not hidden.used
    proc = run_benchmark("ddp", "--mode", "scaling", "--overlap-ctas", "65")
    assert proc.returncode == 2 and "--overlap-ctas" in proc.stderr, proc.stderr


@pytest.mark.requires_gpu("NCCL on two GPUs")
def test_nccl_overlap_with_limited_ctas_gives_the_plain_step():
    if gpus() < 2:
        pytest.skip("NCCL needs a GPU per rank: two GPUs")
    script = ROOT / "benchmarks/tests/mpi_scripts/ddp_nccl_overlap.py"
    proc = subprocess.run([*launcher(), "-n", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300, env=env(HPCLAB_BACKEND="gpu"), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = last_json(proc)
    assert [r["comm"] for r in out["runs"]] == ["nccl"] * 3 and [r["ctas"] for r in out["runs"]] == [None, None, 2]
    assert out["runs"][1]["buckets"] > 2 and all(r["identical"] for r in out["runs"])
    assert out["same_as_plain"] == [True, True] and out["trained"]
