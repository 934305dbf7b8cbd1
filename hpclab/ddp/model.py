"""An MLP whose parameters live in one flat device vector, and its gradients in another.

Flat storage makes broadcasting the weights, all-reducing the gradients, checking replicas and the
optimiser step one operation on one array each; each layer's W and b are views into it. The gradient
vector (the "bucket") ends with two slots for the batch's loss and correct predictions, so one all-reduce
per step carries all of them. ``dtype`` is that of the master weights, gradients and optimiser state,
``compute_dtype`` that of the passes (float16: mixed precision, a copy refreshed after every update).
"""
from __future__ import annotations

import numpy as np

from hpclab.ddp import mlp as K

cuda = K.cuda
EXTRA_SLOTS = 2  # loss, correct predictions
LOSSES = {"xent": K.softmax_cross_entropy, "mse": K.mean_squared_error}


def count_parameters(sizes) -> int:
    """W and b of every layer."""
    return int(sum((n_in + 1) * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:])))


def layer_offsets(sizes) -> list[int]:
    """Where each layer's W starts in the flat vector (W0 at 0, then b0, W1, b1, ...), and the end."""
    return [count_parameters(sizes[:i + 1]) for i in range(len(sizes))]


def slice_bounds(rows: int, slices: int) -> list[int]:
    """``slices`` (at most ``rows``) nearly equal runs of rows: their boundaries, from 0 to ``rows``."""
    slices = max(1, min(int(slices), rows))
    return [rows * s // slices for s in range(slices + 1)]


def init_parameters(sizes, seed: int, dtype=np.float32) -> np.ndarray:
    """PyTorch's default for nn.Linear: W and b uniform in +-1/sqrt(fan_in), flattened."""
    rng = np.random.default_rng(seed)
    parts = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / np.sqrt(n_in)
        parts += [rng.uniform(-bound, bound, size=(n_in, n_out)).ravel(), rng.uniform(-bound, bound, size=n_out)]
    return np.concatenate(parts).astype(dtype)


def unflatten(flat, sizes) -> list:
    """[(W0, b0), (W1, b1), ...] as views into a flat vector (NumPy or device array)."""
    layers, start = [], 0
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w_end = start + n_in * n_out
        layers.append((flat[start:w_end].reshape(n_in, n_out), flat[w_end:w_end + n_out]))
        start = w_end + n_out
    return layers


def flatten(layers) -> np.ndarray:
    """The inverse of :func:`unflatten` for host arrays: W0, b0, W1, b1, ... in one vector."""
    return np.concatenate([np.ravel(a) for pair in layers for a in pair])


def memory_breakdown(sizes, batch: int, optimizer: str = "adam", dtype=np.float32,
                     compute_dtype=None) -> dict[str, int]:
    """Bytes a model of these layer widths needs for training, by purpose (no allocation): master weights,
    a compute copy under mixed precision, gradients (the bucket), optimiser state (SGD's velocity or Adam's
    two moments) and one batch's activations (every layer's inputs and outputs, and their gradients)."""
    dtype, compute_dtype, sizes = np.dtype(dtype), np.dtype(compute_dtype or dtype), [int(s) for s in sizes]
    p, item, citem = count_parameters(sizes), dtype.itemsize, compute_dtype.itemsize
    states = {"sgd": 1, "adam": 2}.get(optimizer, 0)
    return {
        "master_weights": p * item,
        "compute_copy": p * citem if compute_dtype != dtype else 0,
        "gradients": (p + EXTRA_SLOTS) * item,
        "optimizer_state": states * p * item,
        "activations": (sum(sizes) + sum(sizes[1:])) * batch * citem + batch * EXTRA_SLOTS * item,
    }


class MLP:
    """Dense layers with ReLU between them (none after the last), on this rank's GPU."""

    def __init__(self, sizes, dtype=np.float32, compute_dtype=None):
        if len(sizes) < 2 or any(int(s) <= 0 for s in sizes):
            raise ValueError(f"layer widths must be at least two positive numbers, got {list(sizes)}")
        self.sizes = [int(s) for s in sizes]
        self.dtype, self.compute_dtype = np.dtype(dtype), np.dtype(compute_dtype or dtype)
        self.n_params = count_parameters(self.sizes)
        self.offsets = layer_offsets(self.sizes)
        self.params = cuda.device_array(self.n_params, self.dtype)
        self.compute_params = (self.params if self.compute_dtype == self.dtype
                               else cuda.device_array(self.n_params, self.compute_dtype))
        self.layers = unflatten(self.compute_params, self.sizes)
        self.bucket = cuda.device_array(self.n_params + EXTRA_SLOTS, self.dtype)
        self.grads = unflatten(self.bucket[:self.n_params], self.sizes)
        self.stat_slots = self.bucket[self.n_params:]
        self._work: dict[int, dict] = {}
        self._slices: dict[tuple[int, int], list] = {}

    def load(self, flat_host: np.ndarray) -> None:
        if flat_host.shape != (self.n_params,):
            raise ValueError(f"{flat_host.shape[0]} values for a model of {self.n_params} parameters")
        self.params.copy_to_device(np.ascontiguousarray(flat_host, dtype=self.dtype))
        self.refresh_compute_copy()

    def refresh_compute_copy(self) -> None:
        if self.compute_params is not self.params:
            K.cast(self.params, self.compute_params)

    def parameters_host(self) -> np.ndarray:
        return self.params.copy_to_host()

    def memory_bytes(self, batch: int, optimizer: str) -> dict[str, int]:
        """What this model allocates, by purpose (for comparison with 14 x parameters)."""
        return memory_breakdown(self.sizes, batch, optimizer, self.dtype, self.compute_dtype)

    def workspace(self, n: int) -> dict:
        """Activation and gradient buffers for a batch of n rows (allocated once per n)."""
        if n not in self._work:
            c = self.compute_dtype
            self._work[n] = {
                "acts": [cuda.device_array((n, w), c) for w in self.sizes],
                "dz": [None] + [cuda.device_array((n, w), c) for w in self.sizes[1:]],
                "stats": cuda.device_array((n, EXTRA_SLOTS), self.dtype),
            }
        return self._work[n]

    def first_layer_slices(self, n: int, slices: int) -> list:
        """The first layer's input and weight gradient cut into ``slices`` slices of its rows for a batch of n
        (:func:`hpclab.ddp.mlp.row_slices`; made once per n and number of slices)."""
        if (n, slices) not in self._slices:
            self._slices[n, slices] = K.row_slices(self.workspace(n)["acts"][0], self.grads[0][0],
                                                   slice_bounds(self.sizes[0], slices))
        return self._slices[n, slices]

    def forward(self, n: int):
        """Logits of a batch already placed in ``workspace(n)["acts"][0]``; returns them."""
        acts = self.workspace(n)["acts"]
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            K.dense_forward(acts[i], w, b, acts[i + 1], relu=i < last)
        return acts[-1]

    def loss_and_gradients(self, n: int, targets, loss: str, grad_scale: float, loss_scale: float,
                           on_ready=None, first_layer_slices: int = 1):
        """Forward, loss and backward for the n rows in the workspace: the gradients of ``grad_scale * sum of
        per-row losses`` in the bucket, ``loss_scale * sum of losses`` and the correct predictions in its last
        two slots. ``on_ready(i, start)`` as soon as the gradients of layer i from flat index ``start`` on (and of
        every later layer) are written: their all-reduce may start. The first layer's W, written last, in
        ``first_layer_slices`` slices of rows, last rows first, each reported (:mod:`hpclab.ddp.buckets`)."""
        work = self.workspace(n)
        logits = self.forward(n)
        dz = work["dz"][-1]
        LOSSES[loss](logits, targets, dz, work["stats"], grad_scale, loss_scale)
        K.col_sum(work["stats"], self.stat_slots)
        report = on_ready or (lambda i, start: None)
        for i in reversed(range(len(self.layers))):
            w, _ = self.layers[i]
            dw, db = self.grads[i]
            if i == 0 and first_layer_slices > 1:
                K.col_sum(dz, db)                    # b0 lies after W0: written before W0's first slice
                K.weight_gradient_in_slices(work["acts"][0], dz, dw, self.first_layer_slices(n, first_layer_slices),
                                            lambda r0: report(0, r0 * dw.shape[1]))
            else:
                K.dense_backward(work["acts"][i], w, dz, dw, db)
                report(i, self.offsets[i])
            if i > 0:
                dx = K.gemm(dz, w, work["dz"][i], trans_b=True)        # the gradient passed back: dz w^T
                dz = K.relu_backward(dx, work["acts"][i], dx)
        return self.bucket

    def batch_gradients(self, x, y, idx, global_batch: int, loss: str, loss_scale: float = 1.0, **backward):
        """:meth:`loss_and_gradients` of the rows ``idx`` of the data set ``x``, ``y`` (device arrays), scaled so
        that the sums over the ranks are means over the global batch: over its samples (cross-entropy) or over
        every value (squared error, as PyTorch's MSELoss); the gradients also times ``loss_scale``."""
        n, work = idx.shape[0], self.workspace(idx.shape[0])
        if "targets" not in work:
            work["targets"] = cuda.device_array((n, y.shape[1]), y.dtype)
        K.take_rows(x, idx, work["acts"][0])
        K.take_rows(y, idx, work["targets"])
        scale = 1.0 / (global_batch if loss == "xent" else global_batch * self.sizes[-1])
        return self.loss_and_gradients(n, work["targets"], loss, scale * loss_scale, scale, **backward)

    def evaluate_rows(self, x, y, loss: str) -> np.ndarray:
        """[sum of per-row losses, correct predictions] for the rows x (device), no gradients."""
        n = x.shape[0]
        work = self.workspace(n)
        K.cast(x.reshape(x.size), work["acts"][0].reshape(x.size))       # the rows, in the compute dtype
        logits = self.forward(n)
        LOSSES[loss](logits, y, work["dz"][-1], work["stats"], 0.0, 1.0)
        totals = cuda.device_array(EXTRA_SLOTS, self.dtype)
        return K.col_sum(work["stats"], totals).copy_to_host().astype(np.float64)
