"""The PyTorch bridge (hpclab.ddp.torch_ddp): the workshop's DDP script against the workbook's own DDP.

Where PyTorch is installed (the GPU machines; `pip install torch` anywhere), it runs under a real
mpiexec on 1 and 2 ranks: PyTorch DDP's gradients must equal hpclab's Numba DDP gradients to float64
rounding, and Exercise 6's CNN must pass its test accuracy. Without PyTorch those tests are skipped
with that reason; the rendezvous (where rank, world size and rank 0's address come from) is tested
everywhere.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpclab.ddp import torch_ddp
from tests.helpers import ROOT, env, launcher

HAS_TORCH, WHY = torch_ddp.available()


def test_rendezvous_from_slurm():
    slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)",
             "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"}
    r = torch_ddp.rendezvous(env=slurm)
    assert (r["rank"], r["local_rank"], r["world_size"], r["local_size"]) == (5, 1, 8, 4)
    assert (r["master_addr"], r["master_port"], r["from"]) == ("gpu07", 29500 + 123456 % 20000, "Slurm")
    r = torch_ddp.rendezvous(env={**slurm, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "40000"})
    assert (r["master_addr"], r["master_port"]) == ("10.0.0.7", 40000)


def test_rendezvous_from_torchrun_and_a_single_process():
    r = torch_ddp.rendezvous(env={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501"})
    assert (r["rank"], r["world_size"], r["local_rank"], r["from"], r["master_port"]) == (3, 4, 3, "torchrun", 29501)
    r = torch_ddp.rendezvous(env={})                   # this test process: an MPI singleton
    assert (r["rank"], r["world_size"], r["from"], r["master_addr"]) == (0, 1, "MPI", "127.0.0.1")
    assert 0 < r["master_port"] < 65536


@pytest.mark.parametrize("nodelist, first", [("gpu07", "gpu07"), ("node[3,5-7]", "node3"), ("a1,b2", "a1"),
                                             ("holygpu8a[19104-19105]", "holygpu8a19104")])
def test_rank_0_is_the_first_host_of_the_slurm_node_list(nodelist, first):
    slurm = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": nodelist,
             "SLURM_JOB_ID": "7"}
    assert torch_ddp.rendezvous(env=slurm)["master_addr"] == first


def test_without_pytorch_the_bridge_says_why():
    code = "import sys; sys.modules['torch'] = None; from hpclab.ddp import torch_ddp; print(torch_ddp.available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT)
    assert "(False, 'PyTorch is not installed here" in out.stdout, out.stderr
    main = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                           "from hpclab.ddp import torch_ddp; sys.exit(torch_ddp.main([]))"],
                          capture_output=True, text=True, env=env(), cwd=ROOT)
    assert main.returncode == 1 and "PyTorch is not installed" in main.stderr


@pytest.mark.skipif(not HAS_TORCH, reason=WHY)
@pytest.mark.parametrize("ranks", [1, 2])
def test_pytorch_ddp_gradients_equal_hpclab_ddp_and_the_cnn_learns(ranks):
    proc = subprocess.run([*launcher(), "-n", str(ranks), sys.executable, "-m", "hpclab.ddp.torch_ddp"],
                          capture_output=True, text=True, timeout=600, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    grads, cnn = out["gradients"], out["cnn"]
    assert out["ranks"] == grads["ranks"] == cnn["ranks"] == ranks
    assert grads["steps"] == 3 and grads["max_rel_diff"] <= torch_ddp.GRAD_RTOL, grads
    assert cnn["test_accuracy"] >= torch_ddp.THRESHOLD == 0.95, cnn
    assert proc.stdout.count("Epoch ") == cnn["epochs"] == 10           # rank 0 alone prints
