"""Beyond data parallelism (notebook 08): ZeRO-1 trains as DDP does with less memory, both tensor-parallel splits
give X @ W, the pipeline's forward pass and bubble, bad input refused on every rank, and the checks name each
wrong answer."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hpclab.beyond import check, pipeline, zero
from hpclab.ddp import MLP, DDPTrainer, DistributedSampler, count_parameters, init_parameters, memory_breakdown
from hpclab.ddp import reference as R
from hpclab.ddp import unflatten
from hpclab.ddp.data import synthetic

from .helpers import ROOT, env, last_json, launcher

SIZES = [6, 8, 4, 2]                         # 102 parameters


# -- sharding ------------------------------------------------------------------------
@pytest.mark.parametrize("n, ranges", [(1, [(0, 102)]), (2, [(0, 51), (51, 102)]), (3, [(0, 34), (34, 68), (68, 102)]),
                                       (4, [(0, 26), (26, 52), (52, 78), (78, 102)])])
def test_shards_cover_the_vector_in_rank_order_the_last_one_padded(n, ranges):
    assert [zero.shard_range(102, n, r) for r in range(n)] == ranges
    assert zero.shard_range(5, 4, 3) == (5, 5)          # shards of 2: the last rank owns only padding


def test_fewer_parameters_than_ranks_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"2 parameters cannot be sharded among 3 ranks.*at most 2 ranks"):
        zero.shard_range(2, 3, 0)


def test_the_padded_bucket_keeps_the_gradients_first_and_the_loss_slots_after_the_padding():
    model = MLP(SIZES, np.float64)
    assert zero.pad_bucket(model, 4) == 104 and model.bucket.shape == (106,)
    assert model.grads[-1][1].shape == (2,) and model.stat_slots.shape == (2,)
    assert not model.bucket.copy_to_host().any()        # the padding is zeros, and stays zeros


# -- ZeRO-1 against DDP, and what each holds -------------------------------------------
def _train(trainer_for, steps=3):
    x, y = synthetic(96)
    model = MLP(SIZES, np.float64)
    model.load(init_parameters(SIZES, seed=0, dtype=np.float64))
    trainer = trainer_for(model)
    cuda = zero.cuda
    x_dev, y_dev, idx = cuda.to_device(x), cuda.to_device(y), DistributedSampler(96, 24, 0, 1).indices(0)
    losses = [trainer.step(x_dev, y_dev, cuda.to_device(idx[s]), 24)[0] for s in range(steps)]
    return model.parameters_host(), losses, zero.held_bytes(trainer)


def test_zero1_on_one_rank_is_ddp_with_adam_and_matches_numpy():
    from hpclab.mpi import world

    comm = world()
    w_ddp, l_ddp, held_ddp = _train(lambda m: DDPTrainer(m, comm, "mpi-host", optimizer="adam", lr=0.01, loss="mse"))
    w_zero, l_zero, held_zero = _train(lambda m: zero.ZeroTrainer(m, comm, "mpi-host", lr=0.01))
    np.testing.assert_allclose(w_zero, w_ddp, rtol=1e-12, atol=0)
    assert l_zero == l_ddp
    # NumPy's Adam on the same batches
    x, y = synthetic(96)
    p, m, v = init_parameters(SIZES, seed=0, dtype=np.float64), 0.0, 0.0
    for s, rows in enumerate(DistributedSampler(96, 24, 0, 1).global_batches(0)[:3]):
        _, grads = R.mlp_loss_and_grads(unflatten(p, SIZES), x[rows], y[rows], "mse", scale=1 / (24 * 2))
        p, m, v = R.adam(p, np.concatenate([a.ravel() for g in grads for a in g]), m, v, s + 1, 0.01)
    np.testing.assert_allclose(w_zero, p, rtol=1e-10, atol=1e-14)
    states = memory_breakdown(SIZES, 0, "adam", np.float64)
    assert held_zero == {"parameters": states["master_weights"], "gradients": states["gradients"],
                         "optimizer state": states["optimizer_state"], "communication buffer": 102 * 8}
    assert held_ddp["communication buffer"] == held_ddp["gradients"]     # DDP's all-reduce result


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    """One mpiexec -n N launch of tests/mpi_scripts/beyond_ranks.py."""
    n = request.param
    proc = subprocess.run([*launcher(), "-n", str(n), sys.executable, str(ROOT / "tests/mpi_scripts/beyond_ranks.py")],
                          capture_output=True, text=True, timeout=180, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return last_json(proc)


@pytest.mark.mpi
def test_zero1_trains_as_ddp_on_n_ranks(ranks):
    runs = [r["runs"] for r in ranks["ranks"]]
    ddp, z = np.array(runs[0]["ddp"]["weights"]), np.array(runs[0]["zero"]["weights"])
    # float64: the two sum each gradient over the ranks in their own order, a few ulps apart (1e-16), and three
    # Adam steps keep that near 1e-15; 1e-12 leaves room and no real mistake (a missing 1/n, a wrong shard) fits in it.
    np.testing.assert_allclose(z, ddp, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(runs[0]["zero"]["losses"], runs[0]["ddp"]["losses"], rtol=1e-12)
    assert all(r["zero"]["weights"] == runs[0]["zero"]["weights"] for r in runs)   # replicas: bit-identical


@pytest.mark.mpi
def test_zero1_holds_an_nth_of_adams_state(ranks):
    n, p = ranks["size"], count_parameters(SIZES)
    shard = -(-p // n)
    for r in ranks["ranks"]:
        ddp, z = r["runs"]["ddp"]["held"], r["runs"]["zero"]["held"]
        assert ddp["optimizer state"] == 2 * p * 8 and z["optimizer state"] == 2 * shard * 8
        assert z["parameters"] == ddp["parameters"] == p * 8
        assert z["gradients"] == (n * shard + 2) * 8 and z["communication buffer"] == shard * 8


@pytest.mark.mpi
def test_both_tensor_splits_give_x_at_w_on_every_rank(ranks):
    X, W = np.array(ranks["X"], np.float32), np.array(ranks["W"], np.float32)
    for by in ("columns", "rows"):
        assert check.tensor_split([np.array(r["Y"][by]) for r in ranks["ranks"]], X, W, by, quiet=True)


@pytest.mark.mpi
def test_the_pipelined_forward_pass_equals_one_gpus(ranks):
    layers, a = ranks["layers"], np.array(ranks["x"])
    for i, (w, b) in enumerate(unflatten(init_parameters(layers, 0, np.float64), layers)):
        a = R.dense_forward(a, w, b, relu=i < len(layers) - 2)
    np.testing.assert_allclose(ranks["piped"], a, rtol=1e-12, atol=1e-15)
    assert len(ranks["times"]) == ranks["size"] and all(f > 0 and b > 0 for f, b in ranks["times"])


@pytest.mark.mpi
def test_bad_input_stops_every_rank_with_the_fix(ranks):
    n = ranks["size"]
    for r in ranks["ranks"]:
        assert f"the {6 * n - 1} output columns do not divide among {n} ranks" in r["errors"]["columns"]
        assert f"failed on rank {', '.join(map(str, range(n)))} of {n}" in r["errors"]["columns"]
        assert ("fewer parameters than ranks" in r["errors"]["sharding"]) if n > 2 else "sharding" not in r["errors"]


# -- the bubble ----------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_equal_stages_leave_exactly_gpipes_bubble(p, m):
    spans = pipeline.schedule([1.0] * p, [2.0] * p, m)
    assert len(spans) == 2 * p * m
    assert pipeline.idle_fraction(spans) == pytest.approx(pipeline.bubble(p, m), abs=1e-12)
    assert pipeline.bubble(p, m) == (p - 1) / (m + p - 1)


def test_the_schedule_keeps_each_stage_to_one_task_and_the_data_flowing():
    spans = pipeline.schedule([1.0, 3.0, 1.0], [2.0, 5.0, 2.0], 4)
    at = {(s, j, k): (t0, t1) for s, j, k, t0, t1 in spans}
    for s in range(3):
        mine = sorted((t0, t1) for st, _, _, t0, t1 in spans if st == s)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))           # one thing at a time
    for j in range(4):
        assert at[1, j, "F"][0] >= at[0, j, "F"][1] and at[0, j, "B"][0] >= at[1, j, "B"][1]
    assert pipeline.idle_fraction(spans) > pipeline.bubble(3, 4)          # the slow middle stage sets the pace


def test_unequal_stages_never_idle_less_than_the_formula():
    """What notebook 08 says of its measured stages: unequal ones can only add idle time."""
    rng = np.random.default_rng(8)
    for _ in range(500):
        p, m = int(rng.integers(1, 6)), int(rng.integers(1, 33))
        fwd, bwd = rng.exponential(size=p) + 1e-3, rng.exponential(size=p) + 1e-3
        assert pipeline.idle_fraction(pipeline.schedule(fwd, bwd, m)) >= pipeline.bubble(p, m) - 1e-12


# -- the checks name each wrong answer -------------------------------------------------
def _zero_case(n=4, p=102):
    rng = np.random.default_rng(3)
    grad, stepped = rng.standard_normal(p), rng.standard_normal(p)
    shards = np.concatenate([grad, np.zeros(-p % n)]).reshape(n, -1)
    return grad, stepped, list(shards), [stepped.copy() for _ in range(n)]


def test_zero_check_accepts_the_right_step():
    grad, stepped, shards, weights = _zero_case()
    assert check.zero_step(shards, weights, grad, stepped, quiet=True)


@pytest.mark.parametrize("wrong, says", [
    (lambda g, s, sh, w: ([4 * x for x in sh], w), "4 times the mean"),                       # forgot to divide by n
    (lambda g, s, sh, w: ([g] * 4, w), "an all-reduce gives every rank all"),
    (lambda g, s, sh, w: ([x[:25] for x in sh], w), "pad the 102 parameters with zeros to 104"),
    (lambda g, s, sh, w: (sh[1:] + sh[:1], w), "is not shard 0"),
    (lambda g, s, sh, w: (sh, [np.concatenate([s[26:52], s[:26], s[52:]])] * 4), "shard 1 lies where shard 0"),
    (lambda g, s, sh, w: (sh, [np.concatenate([s, [0.0, 0.0]])] * 4), "keep the first 102 values"),
    (lambda g, s, sh, w: (sh, [np.where(np.arange(102) // 26 == r, s, 0.5) for r in range(4)]), "only its own shard"),
])
def test_zero_check_names_the_mistake(wrong, says):
    grad, stepped, shards, weights = _zero_case()
    got_shards, got_weights = wrong(grad, stepped, shards, weights)
    verdict = check.zero_step(got_shards, got_weights, grad, stepped, quiet=True)
    assert not verdict and says in verdict.message, verdict.message


def _xw(n=3):
    rng = np.random.default_rng(4)
    return rng.standard_normal((8, 12)).astype(np.float32), rng.standard_normal((12, 6 * n)).astype(np.float32)


def test_tensor_check_accepts_float32_products_within_the_bound_and_nothing_beyond():
    x, w = _xw()
    y = (x @ w).astype(np.float32)
    assert check.tensor_split([y] * 3, x, w, "columns", quiet=True)
    assert check.tensor_split([y] * 3, x, w, "rows", quiet=True)
    off = y + 3 * check.bound(x, w).astype(np.float32)
    verdict = check.tensor_split([off] * 3, x, w, "rows", quiet=True)
    assert not verdict and "beyond the rounding bound" in verdict.message


@pytest.mark.parametrize("assemble", [lambda parts: np.concatenate(parts, axis=0),
                                      lambda parts: np.concatenate(parts, axis=0).reshape(8, 18)])
def test_a_column_split_assembled_along_the_wrong_axis_is_named(assemble):
    x, w = _xw()
    y = assemble([x @ w[:, r * 6:(r + 1) * 6] for r in range(3)])
    verdict = check.tensor_split([y] * 3, x, w, "columns", quiet=True)
    assert not verdict and "side by side" in verdict.message, verdict.message


def test_a_row_split_without_the_sum_is_named():
    x, w = _xw()
    partials = [x[:, r * 4:(r + 1) * 4] @ w[r * 4:(r + 1) * 4] for r in range(3)]
    verdict = check.tensor_split(partials, x, w, "rows", quiet=True)
    assert not verdict and "partial product only" in verdict.message and "all-reduce" in verdict.message
