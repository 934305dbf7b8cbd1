"""MLP kernels against NumPy, and the NumPy reference against finite differences."""
from __future__ import annotations

import numpy as np
import pytest

from hpclab.matmul import fast as mm, warp
from hpclab.ddp import mlp as K
from hpclab.ddp import reference as R

cuda = K.cuda
rng = np.random.default_rng(1)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


# -- GEMM (the matmul kernels, as the layers call them) ---------------------------------
@pytest.mark.parametrize("kernel,dtype,tol", [(k, d, t) for k in mm.KERNELS
                                              for d, t in ((np.float64, 1e-12), (np.float32, 1e-5))]
                         + [("fast", np.float16, 2e-2), (None, np.float16, 2e-2), (None, np.float64, 1e-12)])
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True)])
def test_gemm_matches_numpy(kernel, dtype, tol, trans):
    # 13 x 6 x 11: partial tiles on the simulator; tests/test_matmul.py covers several blocks
    m, k, n = 13, 6, 11
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    a_in = a.T.copy() if trans[0] else a
    b_in = b.T.copy() if trans[1] else b
    out_dtype = np.float32 if dtype == np.float16 else dtype
    out = K.gemm(dev(a_in), dev(b_in), cuda.device_array((m, n), out_dtype),
                  trans_a=trans[0], trans_b=trans[1], kernel=kernel).copy_to_host()
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * 10)


def test_the_layers_multiply_float32_with_the_warp_kernel_except_on_the_simulator():
    sim = K.backend.is_simulator()
    assert K.gemm_kernel(np.float32) == ("naive" if sim else "warp")
    assert K.gemm_kernel(np.float64) == ("naive" if sim else "fast")
    assert K.gemm_kernel(np.float16) == "fast"          # float16 is multiplied in float32 there


def test_a_weight_gradient_in_row_slices_has_the_bits_of_the_whole_product(monkeypatch):
    """dw = x^T dz in slices of dw's rows by the warp kernel: each slice takes the whole product's tile shape and
    slices of K (on a GPU a deep K is split, and a slice's own plan would split it otherwise), so every element gets
    the bits the one product gives it."""
    sim = K.backend.is_simulator()
    monkeypatch.setattr(K, "gemm_kernel", lambda dtype: "warp")
    n, d, h = (40, 33, 37) if sim else (9000, 333, 777)
    x, dz = (dev(rng.uniform(-1, 1, shape).astype(np.float32)) for shape in ((n, d), (n, h)))
    whole, sliced = (K.cuda.device_array((d, h), np.float32) for _ in range(2))
    K.gemm(x, dz, whole, trans_a=True)
    seen = []
    K.weight_gradient_in_slices(x, dz, sliced, K.row_slices(x, sliced, [0, 11, 22, d]), seen.append)
    assert seen == [22, 11, 0]
    assert sliced.copy_to_host().tobytes() == whole.copy_to_host().tobytes()
    np.testing.assert_allclose(whole.copy_to_host(), x.copy_to_host().T.astype(np.float64) @ dz.copy_to_host(),
                               rtol=0, atol=1e-4 * np.sqrt(n))
    if not sim:     # the case the plan is passed for: K split, and a slice's own plan another split
        assert mm.plan("warp", x, whole, trans_a=True)[1] > 1
        assert warp.plan(11, h, n, True) != warp.plan(d, h, n, True)


def test_gemm_rejects_mismatched_shapes_and_dtypes():
    with pytest.raises(ValueError, match=r"a's columns \(4\) must equal b's rows \(5\)"):
        K.gemm(dev(np.ones((3, 4))), dev(np.ones((5, 2))), cuda.device_array((3, 2)))
    with pytest.raises(ValueError, match="out is 2x3 float64 for float64 operands; use 3x2 float64"):
        K.gemm(dev(np.ones((3, 4))), dev(np.ones((4, 2))), cuda.device_array((2, 3)))
    with pytest.raises(ValueError, match="same dtype"):
        K.gemm(dev(np.ones((3, 4))), dev(np.ones((4, 2), np.float32)), cuda.device_array((3, 2)))
    with pytest.raises(ValueError, match="out is 3x2 float64 for float16 operands; use 3x2 float32 or float16"):
        K.gemm(dev(np.ones((3, 4), np.float16)), dev(np.ones((4, 2), np.float16)),
                cuda.device_array((3, 2)))


# -- layers and elementwise -----------------------------------------------------------
@pytest.mark.parametrize("relu", [False, True])
def test_dense_forward(relu):
    x, w, b = rng.standard_normal((7, 5)), rng.standard_normal((5, 3)), rng.standard_normal(3)
    out = K.dense_forward(dev(x), dev(w), dev(b), cuda.device_array((7, 3)), relu).copy_to_host()
    np.testing.assert_allclose(out, R.dense_forward(x, w, b, relu), rtol=1e-12)


def test_dense_backward_and_relu_backward():
    x, w, dz = rng.standard_normal((7, 5)), rng.standard_normal((5, 3)), rng.standard_normal((7, 3))
    dw, db, dx = (cuda.device_array(s) for s in ((5, 3), (3,), (7, 5)))
    K.dense_backward(dev(x), dev(w), dev(dz), dw, db, dx)
    for got, want in zip((dw, db, dx), R.dense_backward(x, w, dz)):
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-12, atol=1e-12)
    y = np.maximum(rng.standard_normal((7, 5)), 0)
    got = K.relu_backward(dev(x), dev(y), cuda.device_array((7, 5))).copy_to_host()
    np.testing.assert_array_equal(got, R.relu_backward(x, y))


def test_col_sum_take_rows_cast():
    x = rng.standard_normal((9, 4))
    np.testing.assert_allclose(K.col_sum(dev(x), cuda.device_array(4)).copy_to_host(), x.sum(0))
    idx = np.array([8, 0, 3, 3], np.int32)
    rows = K.take_rows(dev(x), dev(idx), cuda.device_array((4, 4), np.float32)).copy_to_host()
    np.testing.assert_array_equal(rows, x[idx].astype(np.float32))
    half = K.cast(dev(x.ravel().astype(np.float32)), cuda.device_array(36, np.float16)).copy_to_host()
    np.testing.assert_array_equal(half, x.ravel().astype(np.float32).astype(np.float16))


# -- losses ------------------------------------------------------------------------
def test_softmax_cross_entropy_matches_reference_and_is_stable():
    logits = rng.standard_normal((6, 10)) * 3
    logits[0] += 1000.0          # exp(1000) overflows unless the max is subtracted
    labels = rng.integers(0, 10, size=6).astype(np.int32)
    dlogits, stats = cuda.device_array((6, 10)), cuda.device_array((6, 2))
    K.softmax_cross_entropy(dev(logits), dev(labels.reshape(-1, 1)), dlogits, stats, 0.5, 0.25)
    losses, grad, correct = R.softmax_cross_entropy(logits, labels)
    got = stats.copy_to_host()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[:, 0], 0.25 * losses, rtol=1e-12)
    np.testing.assert_array_equal(got[:, 1], correct)
    np.testing.assert_allclose(dlogits.copy_to_host(), 0.5 * grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_softmax_cross_entropy_shares_a_row_among_threads(dtype):
    """More classes than a block's threads, a row whose largest logit comes twice (the first is the
    prediction, as np.argmax), rows spread over blocks; float32 and float16 logits computed in float64."""
    n, classes = 5, 2 * K.XENT_THREADS + 3
    logits = (rng.standard_normal((n, classes)) * 2).astype(dtype)
    logits[1, [3, K.XENT_THREADS + 2]] = 9.0      # a tie, in two threads' columns
    labels = np.array([0, K.XENT_THREADS + 2, 3, classes - 1, 7], np.int32)
    dlogits, stats = cuda.device_array((n, classes)), cuda.device_array((n, 2))
    K.softmax_cross_entropy(dev(logits), dev(labels.reshape(-1, 1)), dlogits, stats, 1.0, 1.0)
    losses, grad, correct = R.softmax_cross_entropy(logits.astype(np.float64), labels)
    got = stats.copy_to_host()
    np.testing.assert_allclose(got[:, 0], losses, rtol=1e-12)
    np.testing.assert_array_equal(got[:, 1], correct)
    assert got[1, 1] == 0                           # predicted class 3, the first of the tie
    np.testing.assert_allclose(dlogits.copy_to_host(), grad, rtol=1e-12, atol=1e-15)


def test_mean_squared_error():
    pred, target = rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
    dpred, stats = cuda.device_array((5, 2)), cuda.device_array((5, 2))
    K.mean_squared_error(dev(pred), dev(target), dpred, stats, 0.1, 0.2)
    losses, grad = R.squared_error(pred, target)
    np.testing.assert_allclose(stats.copy_to_host()[:, 0], 0.2 * losses, rtol=1e-12)
    np.testing.assert_allclose(dpred.copy_to_host(), 0.1 * grad, rtol=1e-12)


# -- optimisers ----------------------------------------------------------------------
def test_sgd_with_momentum_three_steps():
    p, v = rng.standard_normal(11), np.zeros(11)
    dp, dv = dev(p), dev(v)
    for _ in range(3):
        g = rng.standard_normal(11)
        K.sgd_update(dp, dev(2 * g), dv, lr=0.1, momentum=0.9, grad_scale=0.5)
        p, v = R.sgd(p, g, v, 0.1, 0.9)
    np.testing.assert_allclose(dp.copy_to_host(), p, rtol=1e-12)
    np.testing.assert_allclose(dv.copy_to_host(), v, rtol=1e-12)


def test_adam_three_steps():
    p, m, v = rng.standard_normal(11), np.zeros(11), np.zeros(11)
    dp, dm, dv = dev(p), dev(m), dev(v)
    for step in range(1, 4):
        g = rng.standard_normal(11)
        K.adam_update(dp, dev(g), dm, dv, step, lr=0.01)
        p, m, v = R.adam(p, g, m, v, step, 0.01)
    np.testing.assert_allclose(dp.copy_to_host(), p, rtol=1e-12)
    np.testing.assert_allclose(dv.copy_to_host(), v, rtol=1e-12)


def test_any_nonfinite():
    assert not K.any_nonfinite(dev(np.ones(5)))
    assert K.any_nonfinite(dev(np.array([1.0, np.inf, 2.0])))
    assert K.any_nonfinite(dev(np.array([np.nan], np.float32)))


# -- whole passes ---------------------------------------------------------------------
def _params(sizes):
    return [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
            for a, b in zip(sizes[:-1], sizes[1:])]


@pytest.mark.parametrize("loss", ["xent", "mse"])
def test_reference_gradients_match_finite_differences(loss):
    sizes = [5, 4, 3]
    params = _params(sizes)
    x = rng.standard_normal((6, 5))
    y = rng.integers(0, 3, 6) if loss == "xent" else rng.standard_normal((6, 3))
    _, grads = R.mlp_loss_and_grads(params, x, y, loss)
    h = 1e-6
    for layer, (w, b) in enumerate(params):
        for arr, grad in ((w, grads[layer][0]), (b, grads[layer][1])):
            for i in np.ndindex(arr.shape):
                old = arr[i]
                arr[i] = old + h
                up, _ = R.mlp_loss_and_grads(params, x, y, loss)
                arr[i] = old - h
                down, _ = R.mlp_loss_and_grads(params, x, y, loss)
                arr[i] = old
                assert abs((up - down) / (2 * h) - grad[i]) < 1e-6


@pytest.mark.parametrize("compute,tol", [(np.float64, 1e-12), (np.float16, 3e-2)])
def test_model_gradients_match_reference(compute, tol):
    from hpclab.ddp import MLP, init_parameters

    sizes = [8, 6, 4]
    master = np.float64 if compute == np.float64 else np.float32
    model = MLP(sizes, master, compute)
    flat = init_parameters(sizes, seed=3, dtype=master)
    model.load(flat)
    x = rng.standard_normal((5, 8))
    labels = rng.integers(0, 4, 5).astype(np.int32).reshape(-1, 1)
    work = model.workspace(5)
    work["acts"][0].copy_to_device(x.astype(compute))
    bucket = model.loss_and_gradients(5, dev(labels), "xent", 1 / 5, 1 / 5).copy_to_host()
    params, offset = [], 0
    for a, b in zip(sizes[:-1], sizes[1:]):
        w = flat[offset:offset + a * b].reshape(a, b).astype(np.float64)
        offset += a * b
        params.append((w, flat[offset:offset + b].astype(np.float64)))
        offset += b
    loss, grads = R.mlp_loss_and_grads(params, x.astype(compute).astype(np.float64), labels[:, 0])
    expected = np.concatenate([np.concatenate([gw.ravel(), gb]) for gw, gb in grads])
    np.testing.assert_allclose(bucket[:-2], expected, rtol=tol, atol=tol * 0.1)
    assert bucket[-2] == pytest.approx(loss, rel=tol)


def test_backward_in_slices_reports_each_and_gives_the_same_bits():
    from hpclab.ddp import MLP, init_parameters

    sizes = [9, 5, 3]
    x = rng.standard_normal((6, 9)).astype(np.float32)
    labels = dev(rng.integers(0, 3, 6).astype(np.int32).reshape(-1, 1))
    buckets, reports = [], []
    for slices in (1, 3):
        model = MLP(sizes, np.float32)
        model.load(init_parameters(sizes, seed=1))
        model.workspace(6)["acts"][0].copy_to_device(x)
        got = []
        model.loss_and_gradients(6, labels, "xent", 1 / 6, 1 / 6, on_ready=lambda i, start: got.append((i, start)),
                                 first_layer_slices=slices)
        buckets.append(model.bucket.copy_to_host())
        reports.append(got)
    np.testing.assert_array_equal(buckets[0], buckets[1])
    assert reports[0] == [(1, 50), (0, 0)]
    assert reports[1] == [(1, 50), (0, 30), (0, 15), (0, 0)]         # rows 6-8, 3-5, 0-2 of W0 (5 wide)


def test_the_slice_views_are_made_once_and_see_each_new_batch():
    from hpclab.ddp import MLP, init_parameters

    sizes = [9, 5, 3]
    labels = dev(rng.integers(0, 3, 6).astype(np.int32).reshape(-1, 1))
    sliced, whole = MLP(sizes, np.float32), MLP(sizes, np.float32)
    for model in (sliced, whole):
        model.load(init_parameters(sizes, seed=2))
    views = sliced.first_layer_slices(6, 3)
    assert sliced.first_layer_slices(6, 3) is views and [r0 for r0, _, _ in views] == [6, 3, 0]
    for _ in range(2):          # the second batch goes through views made for the first
        x = rng.standard_normal((6, 9)).astype(np.float32)
        for model, slices in ((sliced, 3), (whole, 1)):
            model.workspace(6)["acts"][0].copy_to_device(x)
            model.loss_and_gradients(6, labels, "xent", 1 / 6, 1 / 6, first_layer_slices=slices)
        np.testing.assert_array_equal(sliced.bucket.copy_to_host(), whole.bucket.copy_to_host())
    assert sliced.first_layer_slices(6, 3) is views
