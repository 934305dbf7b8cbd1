"""The layers of a chain: what each one computes on a band of rows, on the host and on the GPU.

A windowed layer (convolution, max-pooling) has ``window = (kernel, stride, pad)`` along the
height, which is what the band geometry needs; LRN works across channels only (``window = None``:
no halo). Dense layers come after the chain, on whole images.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

import numpy as np

from hpclab.halo import reference as ref
from hpclab.halo.conv import ConvWeights, check_method, conv_rows_device, linear_device, maxpool_rows_device, tile_rows
from hpclab.halo.geometry import check_ranks, min_input_height


@dataclass
class Conv:
    name: str
    w: np.ndarray                 # (K, C, R, S)
    bias: np.ndarray
    stride: int = 1
    pad: int = 0
    relu: bool = True
    method: str | None = None     # one of conv.METHODS; None: conv.default_method's for this layer

    window = property(lambda self: (self.w.shape[2], self.stride, self.pad))
    # the method this layer runs, and the output rows it computes together (bands are whole tiles)
    runs = property(lambda self: check_method(self.method, *self.w.shape[2:], self.stride))
    tile = property(lambda self: tile_rows(self.runs, self.w.shape[2]))

    def out_shape(self, c, h, w):
        return self.w.shape[0], *ref.check_conv((c, h, w), self.w.shape, self.stride, self.pad)

    def describe(self) -> str:
        k, c, r, s = self.w.shape
        return f"conv {k}@{c}x{r}x{s}/{self.stride} pad {self.pad}" + (" + ReLU" if self.relu else "")

    def host_rows(self, x, pad_top, rows):
        out = ref.conv2d_rows(x, self.w, self.stride, pad_top, self.pad, rows, self.bias)
        return ref.relu(out) if self.relu else out

    @cached_property
    def weights(self) -> ConvWeights:
        return ConvWeights(self.w, self.bias)

    def device_rows(self, x, out, pad_top, t0, t1, stream, workspace=None):
        conv_rows_device(x, self.weights, out, self.stride, pad_top, self.pad, t0, t1, self.relu, stream,
                         self.runs, workspace)


@dataclass
class Pool:
    name: str
    size: int = 3
    stride: int = 2

    window = property(lambda self: (self.size, self.stride, 0))
    tile = 1

    def out_shape(self, c, h, w):
        return c, *ref.check_window(h, w, self.size, self.size, self.stride, 0, what="pooling window")

    def describe(self) -> str:
        return f"max-pool {self.size}x{self.size}/{self.stride}"

    def host_rows(self, x, pad_top, rows):
        return ref.maxpool_rows(x, self.size, self.stride, pad_top, rows)

    def device_rows(self, x, out, pad_top, t0, t1, stream, workspace=None):
        maxpool_rows_device(x, out, self.size, self.stride, pad_top, t0, t1, 0, stream)


@dataclass
class LRN:
    name: str
    size: int = ref.LRN_SIZE
    alpha: float = ref.LRN_ALPHA
    beta: float = ref.LRN_BETA
    k: float = ref.LRN_K
    window = None                  # across channels only: no spatial halo

    def out_shape(self, c, h, w):
        return c, h, w

    def describe(self) -> str:
        return f"LRN size {self.size}, alpha {self.alpha:g}, beta {self.beta:g}, k {self.k:g}"


@dataclass
class Dense:
    name: str
    w: np.ndarray                 # (M, D)
    bias: np.ndarray
    relu: bool

    def describe(self) -> str:
        return f"fully connected {self.w.shape[1]} -> {self.w.shape[0]}" + (" + ReLU" if self.relu else "")

    def host(self, y):
        y = ref.linear(y, self.w, self.bias)
        return ref.relu(y) if self.relu else y

    @cached_property
    def weights(self) -> ConvWeights:
        return ConvWeights(self.w[:, :, None, None], self.bias)

    def device(self, y):
        """The device rows y (N, D) -> (N, M) on the device: a 1x1 convolution (im2col + GEMM)."""
        return linear_device(y, self.weights, self.relu)


def shapes(ops, in_shape):
    """(C, H, W) after each op, starting from in_shape."""
    return list(accumulate(ops, lambda cur, op: op.out_shape(*cur), initial=tuple(in_shape)))[1:]


def least_height(ops, size: int) -> int:
    """Smallest input height for which every windowed op has at least ``size`` output rows."""
    need = 1
    for op in reversed(ops):
        if op.window is not None:
            need = min_input_height(max(need, (size - 1) * op.tile + 1), *op.window)
    return need


def check_chain(ops, in_shape, size: int, what: str = "") -> None:
    """Every windowed op needs at least one output row (one row of its tiles) per rank: say which does not,
    and the fix."""
    cur = tuple(in_shape)
    for op in ops:
        nxt = op.out_shape(*cur)
        if op.window is not None and -(-nxt[1] // op.tile) < size:
            check_ranks(nxt[1], size, f"{what}{op.name} ({op.describe()}, input height {cur[1]})",
                        f", or an input height of at least {least_height(ops, size)}", op.tile)
        cur = nxt
