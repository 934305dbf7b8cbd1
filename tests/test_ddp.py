"""Data parallelism: sampler shares, the exercise's checks, rank-count independence, replicas,
scaling and sweep tables, bad input."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from hpclab.ddp import check
from hpclab.ddp import DistributedSampler, LossScaler, check_batch, flatten, init_parameters, memory_breakdown, unflatten
from hpclab.ddp.data import synthetic
from hpclab.ddp import reference as R

from .helpers import ROOT, env, gpus, last_json, launcher, run_benchmark, run_mpi


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


# -- the exercise's checks, on the numbers a 4-rank run produces ------------------------
SIZES = [6, 4, 2]


def _exercise(global_batch=32, ranks=4, local="sum"):
    """(per-rank local gradients, single-process mean gradient) of step 0, as in notebook 07."""
    x, y = synthetic(256)
    params = unflatten(init_parameters(SIZES, seed=0, dtype=np.float64), SIZES)
    rows = DistributedSampler(256, global_batch, 0, 1).global_batches(0)[0]
    _, grads = R.mlp_loss_and_grads(params, x[rows], y[rows], "mse")
    per = global_batch // ranks
    scale = 1.0 if local == "sum" else 1.0 / per
    shards = [flatten(R.mlp_loss_and_grads(params, x[part], y[part], "mse", scale=scale)[1])
              for part in np.split(rows, ranks)]
    return shards, flatten(grads)


def test_gradient_check_accepts_the_mean_over_the_global_batch():
    shards, ref = _exercise()
    answer = sum(shards) / 32
    assert check.gradients([answer.copy() for _ in range(4)], ref, 32, quiet=True)
    means, _ = _exercise(local="mean")
    assert check.gradients([sum(means) / 4] * 4, ref, 32, local="mean", quiet=True)


@pytest.mark.parametrize("name,divide,needles", [
    ("not averaged", 1, ["summed but not averaged", "32 times too large"]),
    ("per-rank batch", 8, ["per-rank batch (8) instead of the global batch (32)",
                           "4 (the number of ranks) times too large"]),
    ("world size", 4, ["divided by the number of ranks (4)", "8 times too large"]),
    ("twice", 128, ["4 times too small"]),
    ("other", 3.7, ["8.64865 times the right ones"]),
])
def test_gradient_check_names_the_mistaken_division(name, divide, needles):
    shards, ref = _exercise()
    verdict = check.gradients([sum(shards) / divide] * 4, ref, 32, quiet=True)
    assert not verdict
    for needle in needles:
        assert needle in verdict.message, verdict.message


@pytest.mark.parametrize("divide,needles", [
    (64, ["every rank holds the mean gradient"]),
    (32, ["divided by the global batch B = 32 but not by the 2 outputs", "2 times too large", "divide by 64"]),
    (1, ["summed but not averaged", "64 times too large", "B x outputs = 32 x 2 = 64"]),
    (16, ["per-rank batch (8) instead of the global batch (32)"]),
    (4, ["divided by the number of ranks (4)", "16 times too large"]),
    (256, ["4 times too small"]),
])
def test_gradient_check_of_the_mean_over_the_batch_and_its_outputs(divide, needles):
    """Notebook 07's loss is the mean over the global batch's B x 2 values (PyTorch's MSELoss): the sum of the
    ranks' summed gradients is divided by B x 2, and dividing by B alone is named as the slip it is."""
    shards, _ = _exercise()
    x, y = synthetic(256)
    params = unflatten(init_parameters(SIZES, seed=0, dtype=np.float64), SIZES)
    rows = DistributedSampler(256, 32, 0, 1).global_batches(0)[0]
    ref = flatten(R.mlp_loss_and_grads(params, x[rows], y[rows], "mse", scale=1 / (32 * 2))[1])
    verdict = check.gradients([sum(shards) / divide] * 4, ref, 32, outputs=2, quiet=True)
    assert bool(verdict) == (divide == 64), verdict.message
    for needle in needles:
        assert needle in verdict.message, verdict.message


def test_gradient_check_in_pytorch_convention():
    means, ref = _exercise(local="mean")
    verdict = check.gradients([sum(means)] * 4, ref, 32, local="mean", quiet=True)
    assert "summed but not averaged" in verdict.message and "4 (the number of ranks)" in verdict.message
    verdict = check.gradients([sum(means) / 32] * 4, ref, 32, local="mean", quiet=True)
    assert "already averaged over its per-rank batch (8)" in verdict.message


def test_gradient_check_names_both_mistakes_when_their_factors_coincide():
    shards, ref = _exercise(global_batch=16)     # 4 ranks x 4: per-rank batch = ranks
    verdict = check.gradients([sum(shards) / 4] * 4, ref, 16, quiet=True)
    assert "per-rank batch (4)" in verdict.message and " -- or -- " in verdict.message


def test_gradient_check_sees_diverging_replicas():
    shards, ref = _exercise()
    own = [s / 32 for s in shards]                       # no all-reduce
    verdict = check.gradients(own, ref, 32, local_grads=shards, quiet=True)
    assert not verdict and "replicas diverged" in verdict.message
    assert "the all-reduce is missing" in verdict.message
    reduced = [sum(shards) / 32] + own[1:]               # reduce to rank 0 only
    verdict = check.gradients(reduced, ref, 32, local_grads=shards, quiet=True)
    assert "only rank 0 has the averaged gradient" in verdict.message
    verdict = check.gradients(reduced, ref, 32, quiet=True)      # without the local gradients
    assert "rank 1 holds a different averaged gradient" in verdict.message


def test_gradient_check_sees_layout_mistakes():
    shards, ref = _exercise()
    answer = sum(shards) / 32
    w0, b0, w1, b1 = (a.ravel() for pair in unflatten(answer, SIZES) for a in pair)
    swapped = np.concatenate([b0, w0, b1, w1])
    assert "wrong places" in check.gradients([swapped] * 4, ref, 32, quiet=True).message
    short = check.gradients([answer[:-2]] * 4, ref, 32, quiet=True)
    assert "returned 36 values but the model has 38 parameters" in short.message
    none = check.gradients([answer, None, answer, answer], ref, 32, quiet=True)
    assert "rank 1 returned nothing" in none.message


def test_replica_and_loss_checks():
    w = np.linspace(-1, 1, 38)
    assert check.replicas([w, w.copy()], reference=w + 1e-14, quiet=True)
    off = w.copy()
    off[5] += 1e-3
    verdict = check.replicas([w, off, w], quiet=True)
    assert not verdict and "rank 1's weights differ" in verdict.message and "weight 5" in verdict.message
    verdict = check.replicas([w, w], reference=w * 1.01, quiet=True)
    assert not verdict and "differ from single-GPU training" in verdict.message
    losses = [1.0, 0.8, 0.7, 0.65]
    assert check.losses(np.array(losses) * (1 + 1e-9), losses, quiet=True)
    assert "part at step 3" in check.losses([1.0, 0.8, 0.71, 0.6], losses, quiet=True).message
    assert "2 steps on n ranks but 4 on one" in check.losses(losses[:2], losses, quiet=True).message


# -- library pieces without MPI ------------------------------------------------------
def test_flatten_unflatten_and_memory_breakdown():
    from hpclab.ddp import MLP

    flat = np.arange(38.0)
    layers = unflatten(flat, SIZES)
    assert [tuple(a.shape) for pair in layers for a in pair] == [(6, 4), (4,), (4, 2), (2,)]
    np.testing.assert_array_equal(flatten(layers), flat)
    p = 17226                                            # 64 -> 128 -> 64 -> 10
    fp32 = memory_breakdown([64, 128, 64, 10], 64, "adam")
    assert sum(v for k, v in fp32.items() if k != "activations") == 16 * p + 8
    mixed = memory_breakdown([64, 128, 64, 10], 64, "adam", np.float32, np.float16)
    assert mixed["compute_copy"] == 2 * p and mixed["activations"] < fp32["activations"]
    model = MLP(SIZES, np.float32, np.float16)
    assert model.memory_bytes(8, "sgd") == memory_breakdown(SIZES, 8, "sgd", np.float32, np.float16)


def test_sweep_table_in_one_process():
    from hpclab.ddp.sweep import best, format_table, sweep
    from hpclab.device import select_gpu
    from hpclab.mpi import world

    comm = world()
    rows = sweep(comm, select_gpu(comm), [10, 20], [0.05], epochs=1, subset=100, hidden=(8,))
    assert [(r["global_batch"], r["lr"]) for r in rows] == [(10, 0.05), (20, 0.05)]
    assert rows[0]["steps"] == 2 * rows[1]["steps"]          # 69 training images
    assert all(r["replicas_identical"] and 0 <= r["val_acc"] <= 1 for r in rows)
    table = format_table(rows).splitlines()
    assert len(table) == 3 and table[0].split()[:2] == ["batch", "lr"]
    assert best(rows) in rows


# -- under mpiexec -------------------------------------------------------------------
def _mlp(n, *args, timeout=120):
    return run_mpi(n, "run", "ddp-mlp", "--json", *args, timeout=timeout)


@pytest.fixture(scope="module")
def rank_counts():
    """One mpiexec -n 3 launch: the same trainings on 1, 2 and 3 ranks (sub-communicators)."""
    script = ROOT / "tests" / "mpi_scripts" / "ddp_rank_counts.py"
    proc = subprocess.run([*launcher(), "-n", "3", sys.executable, str(script)], capture_output=True,
                          text=True, timeout=180, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return last_json(proc)


@pytest.mark.mpi
def test_one_two_and_three_ranks_give_the_same_losses(rank_counts):
    runs = rank_counts["runs"]
    for many, one, steps in (("b32_2", "b32_1", 16), ("b48_3", "b48_1", 5)):
        assert len(runs[many]["losses"]) == len(runs[one]["losses"]) == steps
        np.testing.assert_allclose(runs[many]["losses"], runs[one]["losses"], rtol=1e-4)
        assert runs[many]["replicas_identical"] and runs[one]["replicas_identical"]
    assert runs["b32_2"]["per_rank_batch"] == 16 and runs["b48_3"]["per_rank_batch"] == 16
    assert runs["b32_1"]["learned"] and runs["b32_1"]["finite"]
    # float64 (the default) agrees far below the 1e-4 the exercise asks for
    np.testing.assert_allclose(runs["b32_2"]["losses"], runs["b32_1"]["losses"], rtol=1e-12)


@pytest.mark.mpi
def test_overlapped_buckets_give_the_same_training(rank_counts):
    """Bucketed all-reduces during the backward pass: the same sums, so the same losses and replicas."""
    runs = rank_counts["runs"]
    for name in ("per_layer", "two", "one"):
        run = runs[f"b32_2_overlap_{name}"]
        np.testing.assert_allclose(run["losses"], runs["b32_2"]["losses"], rtol=1e-12)
        assert run["replicas_identical"]


def test_bucket_plan_covers_every_gradient_once_in_backward_order():
    from hpclab.ddp.buckets import plan
    from hpclab.ddp.model import EXTRA_SLOTS, count_parameters

    sizes = [6, 5, 4, 3]              # layers of 35, 24 and 15 parameters
    total = count_parameters(sizes) + EXTRA_SLOTS
    for bucket_bytes, expected in ((1, 3), (4 * 17, 3), (4 * 18, 2), (4 * 41, 2), (1e9, 1)):
        buckets = plan(sizes, bucket_bytes, 4)
        assert len(buckets) == expected, (bucket_bytes, buckets)
        assert buckets[0].stop == total                      # the loss slots ride in the first bucket
        assert buckets[-1].start == 0 and buckets[-1].ready_after == 0
        for a, b in zip(buckets, buckets[1:]):                # contiguous, last layer first
            assert b.stop == a.start and b.ready_after < a.ready_after
    # a layer larger than the bucket is a bucket of its own
    assert [b.stop - b.start for b in plan([4096, 4096, 10], 1 << 16, 4)] == [4096 * 10 + 10 + 2, 4096 * 4097]
    with pytest.raises(ValueError, match="positive"):
        plan(sizes, 0, 4)


def test_first_layer_slices_cut_the_last_bucket_at_row_boundaries():
    from hpclab.ddp.buckets import plan
    from hpclab.ddp.model import EXTRA_SLOTS, count_parameters

    sizes = [10, 3, 4, 2]                                 # W0 is 10 x 3: rows of 3 values
    total = count_parameters(sizes) + EXTRA_SLOTS
    whole = plan(sizes, 1, 4)
    sliced = plan(sizes, 1, 4, first_layer_slices=4)
    assert [b.name for b in whole] == ["layer 2", "layer 1", "layer 0"]
    assert sliced[:2] == whole[:2]
    # rows 0-1, 2-4, 5-6, 7-9 of W0, last rows first; the top slice also carries b0
    assert [(b.start, b.stop) for b in sliced[2:]] == [(21, whole[1].start), (15, 21), (6, 15), (0, 6)]
    assert [b.name for b in sliced[2:]] == ["layer 0 rows 7-9", "layer 0 rows 5-6", "layer 0 rows 2-4",
                                            "layer 0 rows 0-1"]
    for buckets in (whole, sliced, plan(sizes, 1e9, 4, first_layer_slices=3)):
        assert buckets[0].stop == total and buckets[-1].start == 0
        assert all(b.stop == a.start for a, b in zip(buckets, buckets[1:]))
    one = plan(sizes, 1e9, 4, first_layer_slices=2)       # everything in one bucket, cut in W0
    assert [b.name for b in one] == ["layers 0-2 (layer 0 from row 5)", "layer 0 rows 0-4"]
    assert len(plan(sizes, 1, 4, first_layer_slices=50)) == 2 + 10      # at most a slice per row
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="first_layer_slices"):
            plan(sizes, 1, 4, first_layer_slices=bad)


@pytest.mark.parametrize("optimizer,momentum", [("sgd", 0.9), ("adam", 0.0)])
def test_update_per_bucket_gives_the_update_of_the_whole(optimizer, momentum):
    """With overlap each bucket's update runs once its all-reduce is done: the same weights, bit for bit."""
    from hpclab.ddp import MLP, init_parameters
    from hpclab.ddp.trainer import DDPTrainer, random_batch
    from hpclab.mpi import world

    sizes = [8, 6, 5, 3]
    weights, losses = [], []
    for overlap, slices in ((False, 1), (True, 1), (True, 3)):
        model = MLP(sizes)
        model.load(init_parameters(sizes, seed=2))
        trainer = DDPTrainer(model, world(), "mpi-host", optimizer=optimizer, lr=0.05, momentum=momentum,
                             overlap=overlap, bucket_mb=1e-6, first_layer_slices=slices)
        batch = random_batch(world(), sizes, 8)
        start = time.perf_counter()
        losses.append([trainer.step(*batch, 8)[0] for _ in range(3)])
        wall = time.perf_counter() - start
        weights.append(model.parameters_host())
        if overlap:
            assert len(trainer.buckets) == 2 + slices
            assert set(trainer.phases.seconds) == {"compute", "comm", "update"}
            assert 0 < trainer.host_queue_s < wall        # the host's queueing: a part of the steps' time
    for w, loss in zip(weights[1:], losses[1:]):
        np.testing.assert_array_equal(w, weights[0])
        assert loss == losses[0]
    assert not np.array_equal(weights[0], init_parameters(sizes, seed=2))


def test_bucket_size_must_be_positive():
    proc = run_benchmark("ddp", "--mode", "buckets", "--bucket-mb", "0")
    assert proc.returncode == 2 and "--bucket-mb" in proc.stderr and "0 <" in proc.stderr, proc.stderr


@pytest.mark.mpi
def test_per_rank_batch_fixed_grows_the_global_batch(rank_counts):
    runs = rank_counts["runs"]
    fixed, scaled = runs["per16_3"], runs["per16_3_scaled"]
    assert fixed["global_batch"] == 48 and fixed["steps_per_epoch"] == 5
    assert fixed["replicas_identical"] and scaled["replicas_identical"]
    assert fixed["lr"] == pytest.approx(0.05) and scaled["lr"] == pytest.approx(0.15)
    assert not np.allclose(fixed["losses"][1:], scaled["losses"][1:])


@pytest.mark.mpi
def test_throughput_scaling_rows(rank_counts):
    rows = rank_counts["scaling"]
    assert [r["gpus"] for r in rows] == [1, 2, 3]
    assert [r["per_gpu_batch"] for r in rows] == [12, 6, 4]
    assert rows[0]["speedup"] == pytest.approx(1.0) and rows[0]["efficiency"] == pytest.approx(1.0)
    assert all(r["samples_per_s"] > 0 and 0 <= r["comm_share"] <= 1 and r["sweep"] == "strong"
               for r in rows)
    assert rows[0]["parameters"] == 38


@pytest.mark.mpi
def test_program_on_two_ranks_matches_one_rank(rank_counts):
    two = _mlp(2, "--global-batch", "32", "--epochs", "2", "--samples", "256")
    assert two.returncode == 0, two.stderr
    out = last_json(two)
    res = out["result"]
    assert out["passed"] and out["ranks"] == 2
    assert res["replicas_identical"] and res["per_rank_batch"] == 16 and res["steps_per_epoch"] == 8
    np.testing.assert_allclose(res["losses"], rank_counts["runs"]["b32_1"]["losses"], rtol=1e-4)
    assert res["epoch_losses"][-1] < res["epoch_losses"][0]
    assert "Replicas identical  = True" in two.stdout


def _fails_clearly(proc, *needles):
    assert proc.returncode != 0
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.mark.mpi
def test_global_batch_not_divisible_is_refused_on_every_rank():
    proc = _mlp(3, "--global-batch", "32", timeout=60)
    _fails_clearly(proc, "does not divide among 3 ranks", "--global-batch 30 or 33")
    assert proc.returncode == 2 and proc.stderr.count("does not divide") == 1   # agreed, said once


@pytest.mark.mpi
def test_batch_larger_than_data_set_is_refused():
    _fails_clearly(_mlp(2, "--global-batch", "2048", timeout=60),
                   "larger than the data set (1024 samples)", "--global-batch 1024 or less")


@pytest.mark.mpi
def test_nan_loss_stops_every_rank():
    proc = _mlp(2, "--global-batch", "32", "--lr", "1e12", "--epochs", "1", "--samples", "128",
                timeout=90)
    _fails_clearly(proc, "training diverged", "lower --lr", "[rank 0] error", "[rank 1] error")


@pytest.mark.mpi
def test_mismatched_models_are_an_error_not_a_hang():
    base = [sys.executable, "-m", "hpclab", "run", "ddp-mlp", "--epochs", "1", "--samples", "64"]
    cmd = [*launcher(), "-n", "1", *base, "--hidden", "4", ":", "-n", "1", *base, "--hidden", "5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    _fails_clearly(proc, "model shape check failed on rank 1", "model [6, 5, 2]",
                   "rank 0 has [6, 4, 2]")


@pytest.mark.mpi
def test_digits_reduced_configuration_reaches_its_threshold():
    proc = run_mpi(2, "run", "ddp-digits", "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = last_json(proc)
    res = out["result"]
    # the simulator trains a reduced configuration, a GPU the full one; each has its threshold
    sim = out["backend"] == "sim"
    assert res["config"]["reduced"] == sim and ("reduced configuration" in proc.stdout) == sim
    assert res["test_accuracy"] >= res["config"]["threshold"] and out["passed"]
    assert res["replicas_identical"]
    assert proc.stdout.count("| val loss ") == res["config"]["epochs"]
