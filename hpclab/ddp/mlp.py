"""GPU kernels for training a multilayer perceptron: everything one step needs.

A dense layer is ``Y = act(X @ W + b)``, X (batch, in), W (in, out), b (out,); backward, from
``dZ = dY * act'(Z)``: grad W = X^T dZ, grad b = column sums of dZ, grad X = dZ W^T, the products by
:func:`gemm` (:mod:`hpclab.matmul.fast`). Kernels accumulate in float32 (float64 for float64 data; the
softmax always in float64) and store in the output's dtype: float64 for exact comparisons between rank
counts, float32, float16 for mixed precision. Grid-stride loops make any launch shape compute the same answer.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from hpclab import backend
from hpclab.backend import cuda as _cuda

cuda = _cuda()  # before anything of numba loads: the backend is chosen here
from hpclab.launch import launch_1d  # noqa: E402
from hpclab.matmul import fast as mm  # noqa: E402
from hpclab.quick_launch import Launches  # noqa: E402
from numba import float64, int32  # noqa: E402
from numba.core.errors import NumbaPerformanceWarning  # noqa: E402

# A small model launches small grids on purpose (Exercise 5's tiny MLP is the example of DDP not paying
# off); Numba's under-utilisation hint would print on every rank for every kernel.
warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely", category=NumbaPerformanceWarning)

# Adding it widens float16 to float32 and leaves float32 and float64 as they are (a NumPy scalar: a
# constant in a compiled kernel, cheap on the simulator).
WIDEN = np.float32(0)


# -- matrix multiply ----------------------------------------------------------------
def gemm_kernel(dtype) -> str:
    """The warp kernel for float32 on a GPU, the fast one for float16 and float64; on the simulator the naive
    one for float32 and float64: there each barrier is a round of Python thread switches and the naive kernel
    trains 5 to 20 times faster (float16 needs the fast one)."""
    if np.dtype(dtype) == mm.HALF:
        return "fast"
    if backend.is_simulator():
        return "naive"
    return "warp" if np.dtype(dtype) == np.float32 else "fast"


def gemm(a, b, out, trans_a: bool = False, trans_b: bool = False, kernel: str | None = None,
         split: int | None = None, config=None):
    """out = op(a) @ op(b) on the device; returns out. a and b share a dtype; float16 is multiplied in
    float32 and stored as out's (float16 or float32). Shapes are checked: a wrong layer size is an error.
    ``config``, ``split``: the kernel's tile shape and slices of K (None: its own choice)."""
    kernel = kernel or gemm_kernel(a.dtype)
    M, _, N, dtype = mm.check_operands(a, b, kernel, trans_a, trans_b)
    if tuple(out.shape) != (M, N) or np.dtype(out.dtype) not in (dtype, mm.acc_dtype(dtype)):
        raise ValueError(f"out is {'x'.join(map(str, out.shape))} {np.dtype(out.dtype)} for {dtype} operands; "
                         f"use {M}x{N} {mm.acc_dtype(dtype)}{' or float16' if dtype == mm.HALF else ''}")
    mm.launch(kernel, a, b, out, config=config, trans_a=trans_a, trans_b=trans_b, split=split)
    return out


# -- elementwise and reductions ------------------------------------------------------
def _over(kernel, items):
    """The quick launches (:mod:`hpclab.quick_launch`: a training step starts some twenty of these, and Numba's
    own launch would keep the host busier than the GPU) of a grid-stride ``kernel`` over ``items(*args)``."""
    return Launches(lambda *args, variant=None: (kernel, *launch_1d(items(*args))))


@cuda.jit
def bias_act_kernel(z, bias, out, relu):
    """out = z + bias (broadcast over rows), then ReLU if asked; out may be z."""
    n_cols = z.shape[1]
    for e in range(cuda.grid(1), z.size, cuda.gridsize(1)):
        i = e // n_cols
        j = e % n_cols
        v = z[i, j] + WIDEN + bias[j]
        if relu and v < 0:
            out[i, j] = 0
        else:
            out[i, j] = v


@cuda.jit
def relu_backward_kernel(dy, y, out):
    """out = dy where the ReLU was active (y > 0), else 0; out may be dy."""
    n_cols = dy.shape[1]
    for e in range(cuda.grid(1), dy.size, cuda.gridsize(1)):
        i = e // n_cols
        j = e % n_cols
        if y[i, j] > WIDEN:
            out[i, j] = dy[i, j]
        else:
            out[i, j] = 0


def relu_backward(dy, y, out):
    _relu_backward(dy, y, out)
    return out


_relu_backward = _over(relu_backward_kernel, lambda dy, y, out: dy.size)


@cuda.jit
def col_sum_kernel(x, out):
    """out[j] = sum over rows of x[:, j], one thread per column, rows in order."""
    for j in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        s = WIDEN
        for i in range(x.shape[0]):
            s += x[i, j]
        out[j] = s


def col_sum(x, out):
    """Column sums of a 2-D array (bias gradient; per-row losses to a total)."""
    if out.shape[0] != x.shape[1]:
        raise ValueError(f"col_sum: out has {out.shape[0]} entries for {x.shape[1]} columns")
    _col_sum(x, out)
    return out


_col_sum = _over(col_sum_kernel, lambda x, out: x.shape[1])


@cuda.jit
def take_rows_kernel(src, idx, dst):
    """dst[r, :] = src[idx[r], :] (casting to dst's dtype): a batch from the data set."""
    n_cols = src.shape[1]
    for e in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        r = e // n_cols
        c = e % n_cols
        dst[r, c] = src[idx[r], c]


def take_rows(src, idx, dst):
    if dst.shape[0] != idx.shape[0] or dst.shape[1] != src.shape[1]:
        raise ValueError(f"take_rows: {idx.shape[0]} indices into {src.shape} do not fill {dst.shape}")
    _take_rows(src, idx, dst)
    return dst


_take_rows = _over(take_rows_kernel, lambda src, idx, dst: dst.size)


@cuda.jit
def cast_kernel(src, dst):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        dst[i] = src[i]


def cast(src, dst):
    """dst = src converted to dst's dtype (1-D; float32 master weights -> float16 copy)."""
    _cast(src, dst)
    return dst


_cast = _over(cast_kernel, lambda src, dst: src.size)


# -- losses ------------------------------------------------------------------------
# Threads per row of the softmax: the row's classes are shared among them (4096 classes in the scaling
# MLP; benchmarks/HISTORY.md says why). On the simulator, few: each barrier is a round of Python thread switches.
XENT_THREADS = 4 if backend.is_simulator() else 128


@cuda.jit(device=True)
def _block_reduce(vals, idxs, tid, find_max):
    """Tree reduction of the block's shared (value, index) pairs into slot 0: the sum of the values, or
    their maximum with the smallest index among equal ones (np.argmax's choice)."""
    cuda.syncthreads()
    step = XENT_THREADS // 2
    while step > 0:
        if tid < step:
            v, i = vals[tid + step], idxs[tid + step]
            if not find_max:
                vals[tid] += v
            elif v > vals[tid] or (v == vals[tid] and i < idxs[tid]):
                vals[tid], idxs[tid] = v, i
        cuda.syncthreads()
        step //= 2


@cuda.jit
def softmax_xent_kernel(logits, labels, dlogits, stats, grad_scale, loss_scale):
    """One block per row (grid-stride over rows), its threads striding over the classes, in float64:
    loss = logsumexp(z) - z[label] (max subtracted first: no overflow),
    dlogits = (softmax - onehot) * grad_scale, stats = (loss * loss_scale, correct)."""
    vals = cuda.shared.array(XENT_THREADS, float64)
    idxs = cuda.shared.array(XENT_THREADS, int32)
    tid = cuda.threadIdx.x
    n_classes = logits.shape[1]
    for i in range(cuda.blockIdx.x, logits.shape[0], cuda.gridDim.x):
        best, at = -math.inf, n_classes
        for j in range(tid, n_classes, XENT_THREADS):     # each thread's columns in order: its first max
            z = float64(logits[i, j] + WIDEN)
            if z > best:
                best, at = z, j
        vals[tid], idxs[tid] = best, at
        _block_reduce(vals, idxs, tid, True)
        zmax, predicted = vals[0], idxs[0]
        cuda.syncthreads()                                  # all have read slot 0 before it is reused
        total = 0.0
        for j in range(tid, n_classes, XENT_THREADS):
            total += math.exp(float64(logits[i, j] + WIDEN) - zmax)
        vals[tid] = total
        _block_reduce(vals, idxs, tid, False)
        total = vals[0]
        label = labels[i, 0]
        for j in range(tid, n_classes, XENT_THREADS):
            p = math.exp(float64(logits[i, j] + WIDEN) - zmax) / total
            if j == label:
                p -= 1
            dlogits[i, j] = p * grad_scale
        if tid == 0:
            stats[i, 0] = (math.log(total) + zmax - float64(logits[i, label] + WIDEN)) * loss_scale
            stats[i, 1] = 1 if predicted == label else 0
        cuda.syncthreads()                                  # the next row overwrites the shared slots


@cuda.jit
def mse_kernel(pred, target, dpred, stats, grad_scale, loss_scale):
    """Per row: stats = (sum_j (p - t)^2 * loss_scale, 0), dpred = 2 (p - t) * grad_scale."""
    for i in range(cuda.grid(1), pred.shape[0], cuda.gridsize(1)):
        s = WIDEN
        for j in range(pred.shape[1]):
            d = pred[i, j] + WIDEN - target[i, j]
            s += d * d
            dpred[i, j] = 2 * d * grad_scale
        stats[i, 0] = s * loss_scale
        stats[i, 1] = 0


def softmax_cross_entropy(logits, labels, dlogits, stats, grad_scale: float, loss_scale: float):
    """Softmax cross-entropy of each row against (n, 1) int32 labels: the gradient of ``sum(losses) *
    grad_scale`` into dlogits, per row ``(loss * loss_scale, 1 if right)`` into stats (n, 2). With both
    scales 1/global_batch, stats summed over rows and ranks are the batch's mean loss and accuracy."""
    _softmax_xent(logits, labels, dlogits, stats, grad_scale, loss_scale)
    return dlogits


# A block per row (one on the simulator), XENT_THREADS threads sharing its classes
_softmax_xent = Launches(lambda logits, *_, variant=None: (
    softmax_xent_kernel, 1 if backend.is_simulator() else min(logits.shape[0], 65535), XENT_THREADS))


def mean_squared_error(pred, target, dpred, stats, grad_scale: float, loss_scale: float):
    """Squared error per row (summed over outputs), as :func:`softmax_cross_entropy`; PyTorch's ``MSELoss``
    (mean over every element) is ``scale = 1 / (global_batch * outputs)``."""
    _mse(pred, target, dpred, stats, grad_scale, loss_scale)
    return dpred


_mse = _over(mse_kernel, lambda pred, *_: pred.shape[0])


# -- optimisers (flat parameter vectors) ---------------------------------------------
@cuda.jit
def sgd_kernel(p, g, v, lr, momentum, grad_scale):
    """v = momentum v + g * grad_scale;  p -= lr v   (PyTorch's SGD with momentum)."""
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        vi = momentum * v[i] + g[i] * grad_scale
        v[i] = vi
        p[i] -= lr * vi


def sgd_update(params, grads, velocity, lr: float, momentum: float = 0.0, grad_scale: float = 1.0):
    _sgd(params, grads, velocity, lr, momentum, grad_scale)
    return params


_sgd = _over(sgd_kernel, lambda p, *_: p.size)


@cuda.jit
def adam_kernel(p, g, m, v, lr, beta1, beta2, eps, corr1, corr2, grad_scale):
    """Adam: moments of the gradient, bias-corrected by corr = 1 - beta**t."""
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        gi = g[i] * grad_scale
        mi = beta1 * m[i] + (1 - beta1) * gi
        vi = beta2 * v[i] + (1 - beta2) * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] -= lr * (mi / corr1) / (math.sqrt(vi / corr2) + eps)


def adam_update(params, grads, m, v, step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999,
                eps: float = 1e-8, grad_scale: float = 1.0):
    """One Adam step; ``step`` counts from 1."""
    corr1, corr2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    _adam(params, grads, m, v, lr, beta1, beta2, eps, corr1, corr2, grad_scale)
    return params


_adam = _over(adam_kernel, lambda p, *_: p.size)


@cuda.jit
def nonfinite_kernel(x, flag):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        if not math.isfinite(x[i]):
            flag[0] = 1


def any_nonfinite(x) -> bool:
    """Whether a 1-D device array holds inf or NaN (the loss-scaling overflow test)."""
    flag = cuda.to_device(np.zeros(1, np.int32))
    nonfinite_kernel[launch_1d(x.size)](x, flag)
    return bool(flag.copy_to_host()[0])


# -- layers ------------------------------------------------------------------------
def dense_forward(x, w, b, out, relu: bool):
    """out = act(x @ w + b)."""
    gemm(x, w, out)
    _bias_act(out, b, out, relu)
    return out


_bias_act = _over(bias_act_kernel, lambda z, bias, out, relu: out.size)


def row_slices(x, dw, bounds) -> list:
    """(r0, x[:, r0:r1], dw[r0:r1]) for each slice [r0, r1) of dw's rows, last rows first: the views of
    :func:`weight_gradient_in_slices`, made once and kept, as Numba builds a column slice of x one row's extent
    at a time (slow: benchmarks/HISTORY.md)."""
    return [(r0, x[:, r0:r1], dw[r0:r1]) for r0, r1 in reversed(list(zip(bounds[:-1], bounds[1:])))]


def weight_gradient_in_slices(x, dz, dw, slices, on_slice):
    """dw = x^T dz in the ``slices`` of :func:`row_slices`, ``on_slice(r0)`` after each. A slice reads columns
    r0:r1 of x (a strided view) with the whole product's slices of K, so every element gets the bits that one
    product would give it."""
    kernel = gemm_kernel(x.dtype)
    config, split = mm.plan(kernel, x, dw, trans_a=True)
    for r0, x_cols, dw_rows in slices:
        gemm(x_cols, dz, dw_rows, trans_a=True, kernel=kernel, split=split, config=config)
        on_slice(r0)
    return dw


def dense_backward(x, w, dz, dw, db, dx=None):
    """Gradients of a dense layer from dZ (the gradient before the activation): dw = x^T dz, db = column
    sums of dz, and dx = dz w^T unless dx is None (the first layer needs no gradient for its input)."""
    gemm(x, dz, dw, trans_a=True)
    col_sum(dz, db)
    if dx is not None:
        gemm(dz, w, dx, trans_b=True)
    return dw, db, dx
