"""Data parallelism: sampler shares, rank-count independence, replicas, bad input."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hpclab.ddp import DistributedSampler, LossScaler, check_batch
from .helpers import ROOT, env, last_json, mpiexec, run_mpi


# -- sampler (no MPI needed: every rank's view is computed here) -----------------------
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("n,batch", [(96, 24), (103, 12), (50, 48)])
def test_union_of_rank_batches_is_the_global_batch(size, n, batch):
    if batch % size:
        batch = batch // size * size
    samplers = [DistributedSampler(n, batch, r, size, seed=5) for r in range(size)]
    for epoch in range(2):
        glob = samplers[0].global_batches(epoch)
        assert glob.shape == (n // batch, batch)
        assert len(set(glob.ravel().tolist())) == glob.size           # no sample twice
        shards = [s.indices(epoch) for s in samplers]
        assert all(s.shape == (n // batch, batch // size) for s in shards)
        np.testing.assert_array_equal(np.concatenate(shards, axis=1), glob)
    # the same order for any rank count (that is what makes 1 and n ranks agree)
    one = DistributedSampler(n, batch, 0, 1, seed=5)
    np.testing.assert_array_equal(one.global_batches(1), samplers[0].global_batches(1))
    assert not np.array_equal(one.global_batches(0), one.global_batches(1))


def test_check_batch_messages():
    with pytest.raises(ValueError, match=r"does not divide among 3 ranks.*30 or 33"):
        check_batch(1024, 32, 3)
    with pytest.raises(ValueError, match=r"larger than the data set \(100 samples\).*100 or less"):
        check_batch(100, 128, 2)
    assert check_batch(100, 48, 4) == 12


def test_loss_scaler_backs_off_and_grows():
    s = LossScaler(scale=1024.0, growth_interval=2)
    s.update(overflow=True)
    assert s.scale == 512 and s.skipped == 1
    s.update(False)
    s.update(False)
    assert s.scale == 1024


# -- under mpiexec -------------------------------------------------------------------
def _mlp(n, *args, timeout=120):
    return run_mpi(n, "run", "ddp-mlp", "--json", *args, timeout=timeout)


@pytest.mark.mpi
def test_one_and_two_ranks_give_the_same_losses():
    one = _mlp(1, "--global-batch", "32", "--epochs", "2")
    two = _mlp(2, "--global-batch", "32", "--epochs", "2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    r1, r2 = last_json(one)["result"], last_json(two)["result"]
    assert len(r1["losses"]) == len(r2["losses"]) == 64
    np.testing.assert_allclose(r2["losses"], r1["losses"], rtol=1e-4)
    assert r1["replicas_identical"] and r2["replicas_identical"]
    assert r2["per_rank_batch"] == 16
    assert r1["epoch_losses"][-1] < r1["epoch_losses"][0]


@pytest.mark.mpi
def test_three_ranks_match_one_and_per_rank_mode_grows_the_batch():
    args = ("--global-batch", "48", "--epochs", "1", "--samples", "240", "--dtype", "float32")
    one, three = _mlp(1, *args), _mlp(3, *args)
    assert three.returncode == 0, three.stderr
    np.testing.assert_allclose(last_json(three)["result"]["losses"],
                               last_json(one)["result"]["losses"], rtol=1e-4)
    fixed = _mlp(3, "--per-rank-batch", "16", "--epochs", "1", "--samples", "240")
    res = last_json(fixed)["result"]
    assert res["global_batch"] == 48 and res["steps_per_epoch"] == 5 and res["replicas_identical"]


def _fails_clearly(proc, *needles):
    assert proc.returncode != 0
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.mark.mpi
def test_global_batch_not_divisible_is_refused_on_every_rank():
    proc = _mlp(3, "--global-batch", "32", timeout=60)
    _fails_clearly(proc, "does not divide among 3 ranks", "--global-batch 30 or 33",
                   "[rank 0] error", "[rank 2] error")


@pytest.mark.mpi
def test_batch_larger_than_data_set_is_refused():
    _fails_clearly(_mlp(2, "--global-batch", "2048", timeout=60),
                   "larger than the data set (1024 samples)", "--global-batch 1024 or less")


@pytest.mark.mpi
def test_nan_loss_stops_every_rank():
    proc = _mlp(2, "--global-batch", "32", "--lr", "1e12", "--epochs", "1", timeout=90)
    _fails_clearly(proc, "training diverged", "lower --lr", "[rank 0] error", "[rank 1] error")


@pytest.mark.mpi
def test_mismatched_models_are_an_error_not_a_hang():
    base = [sys.executable, "-m", "hpclab", "run", "ddp-mlp", "--epochs", "1", "--samples", "64"]
    cmd = [mpiexec(), "-n", "1", *base, "--hidden", "4", ":", "-n", "1", *base, "--hidden", "5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    _fails_clearly(proc, "model shape check failed on rank 1", "model [6, 5, 2]",
                   "rank 0 has [6, 4, 2]")


@pytest.mark.mpi
def test_digits_reduced_configuration_reaches_its_threshold():
    proc = run_mpi(2, "run", "ddp-digits", "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = last_json(proc)
    res = out["result"]
    assert res["config"]["reduced"] and "reduced configuration" in proc.stdout
    assert res["test_accuracy"] >= res["config"]["threshold"] and out["passed"]
    assert res["replicas_identical"]
    assert proc.stdout.count("| val loss ") == res["config"]["epochs"]
