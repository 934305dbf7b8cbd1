"""Tensor parallelism: one dense layer's product Y = X @ W split among the ranks, Megatron-LM's two ways.

By columns, rank r holds W[:, cols_r] and computes Y[:, cols_r], a slice of the outputs (it needs all of X); an
all-gather assembles Y. By rows, rank r holds W[rows_r, :] and the matching input features X[:, rows_r]; its product
is a partial sum of every element of Y, and an all-reduce adds the partials. Only its slice of W goes to its GPU.
"""
from __future__ import annotations

import numpy as np

from hpclab import comm as hcomm
from hpclab.ddp import mlp as K
from hpclab.matmul import fast as mm

cuda = K.cuda


def _slices(be, x, w, axis: int, what: str):
    """This rank's parts of X and W on its GPU, the input checked on every rank first."""
    with hcomm.step(be.comm, f"tensor-parallel layer split by {what}"):
        mm.check_operands(x, w)                           # shapes and dtypes that multiply, or a clear error
        if w.shape[axis] % be.size:
            lower = w.shape[axis] // be.size * be.size
            raise ValueError(f"the {w.shape[axis]} {what} do not divide among {be.size} ranks; use "
                             f"{' or '.join(str(v) for v in (lower, lower + be.size) if v)} (a multiple of {be.size})")
    k = w.shape[axis] // be.size
    mine = slice(be.rank * k, (be.rank + 1) * k)
    x_part, w_part = (x, w[:, mine]) if axis else (x[:, mine], w[mine])
    return cuda.to_device(np.ascontiguousarray(x_part)), cuda.to_device(np.ascontiguousarray(w_part))


def column_parallel(be, x, w) -> np.ndarray:
    """X @ W with W's columns split: this rank's slice of Y on its GPU, then the slices all-gathered."""
    x_dev, w_dev = _slices(be, x, w, 1, "output columns")
    y_part = K.gemm(x_dev, w_dev, cuda.device_array((x.shape[0], w_dev.shape[1]), x.dtype))
    stacked = be.allgather(y_part).copy_to_host()         # (ranks x batch, k): stacked along the first axis
    return np.concatenate(np.split(stacked, be.size), axis=1)   # Y's column slices side by side


def row_parallel(be, x, w) -> np.ndarray:
    """X @ W with W's rows (and X's features) split: this rank's partial product, then all-reduced (sum)."""
    x_dev, w_dev = _slices(be, x, w, 0, "input features")
    partial = K.gemm(x_dev, w_dev, cuda.device_array((x.shape[0], w.shape[1]), x.dtype))
    return be.allreduce(partial, op="sum").copy_to_host()

