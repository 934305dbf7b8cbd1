"""NumPy versions of the MLP kernels, for clarity, not speed: the answers the GPU kernels are tested against.

:func:`mlp_loss_and_grads` is a whole forward and backward pass; the tests check it against finite
differences, then check the GPU against it.
"""
from __future__ import annotations

import numpy as np


def dense_forward(x, w, b, relu: bool):
    z = x @ w + b
    return np.maximum(z, 0) if relu else z


def dense_backward(x, w, dz):
    """(dw, db, dx) of a dense layer from the gradient before its activation."""
    return x.T @ dz, dz.sum(axis=0), dz @ w.T


def relu_backward(dy, y):
    return np.where(y > 0, dy, 0)


def softmax_cross_entropy(logits, labels):
    """(per-row losses, gradient of their sum, per-row correct) with a stable softmax."""
    z = logits - logits.max(axis=1, keepdims=True)
    logsum = np.log(np.exp(z).sum(axis=1))
    rows = np.arange(len(labels))
    losses = logsum - z[rows, labels]
    grad = np.exp(z - logsum[:, None])
    grad[rows, labels] -= 1
    correct = (logits.argmax(axis=1) == labels).astype(logits.dtype)
    return losses, grad, correct


def squared_error(pred, target):
    """(per-row sums of squared errors, gradient of their sum)."""
    d = pred - target
    return (d * d).sum(axis=1), 2 * d


def sgd(p, g, v, lr, momentum=0.0):
    v = momentum * v + g
    return p - lr * v, v


def adam(p, g, m, v, step, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr * (m / (1 - beta1 ** step)) / (np.sqrt(v / (1 - beta2 ** step)) + eps)
    return p, m, v


def mlp_loss_and_grads(params, x, y, loss: str = "xent", scale: float | None = None):
    """(loss, [(dW0, db0), ...]) of an MLP (ReLU between layers, none after the last) with ``params``
    [(W0, b0), ...]: ``scale * sum of per-row losses`` (default 1/rows), "xent" (y: integer labels) or "mse"."""
    scale = 1.0 / len(x) if scale is None else scale
    acts = [x]
    for i, (w, b) in enumerate(params):
        acts.append(dense_forward(acts[-1], w, b, relu=i < len(params) - 1))
    if loss == "xent":
        losses, dout, _ = softmax_cross_entropy(acts[-1], y)
    else:
        losses, dout = squared_error(acts[-1], y)
    grads = []
    dz = dout * scale
    for i in reversed(range(len(params))):
        w, _ = params[i]
        dw, db, dx = dense_backward(acts[i], w, dz)
        grads.append((dw, db))
        if i > 0:
            dz = relu_backward(dx, acts[i])
    return float(losses.sum() * scale), grads[::-1]
