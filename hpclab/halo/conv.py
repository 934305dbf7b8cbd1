"""The GPU kernels of an AlexNet block: convolution, max-pooling, local response normalisation.

``conv2d_kernel`` is the convolution to read: one thread per output value, every input and weight
read from global memory (the sum is :mod:`hpclab.halo.reference`'s), and the simulator's default. The
faster ``METHODS`` are the topic's advanced part, the default on a GPU (``default_method``): ``conv_winograd``
where it applies (stride 1, 3x3 or 5x5), ``conv_gemm`` elsewhere; a tiled direct kernel is measured in
``benchmarks/conv_direct.py``. Each sums an output value in an order that does not depend on the band
(Winograd's tiles given bands of whole tiles: :mod:`hpclab.halo.geometry`), so a band on one rank is bit
for bit those rows of the whole.

Rows: the kernels compute output rows [oh_begin, oh_end) of a band whose input row
``oh * stride - pad_top + r`` is local row index; rows outside the band are zero (padding, or
beyond the image edge). ``pad_top = pad`` and the full image give the ordinary layer.
"""
from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from hpclab import backend
from hpclab.backend import cuda as _cuda
from hpclab.halo import conv_gemm, conv_winograd, reference as ref
from hpclab.launch import launch_1d, unravel4

cuda = _cuda()
from numba import float32  # noqa: E402  (after the backend is chosen)

METHODS = {"naive": "the plain kernel, one thread per output value", "gemm": "im2col + register-blocked GEMM",
           "winograd": "Winograd " + " / ".join(f"F({m}x{m}, {r}x{r})" for r, m in conv_winograd.TILES.items())}


@cuda.jit
def conv2d_kernel(x, w, bias, out, stride, pad_top, pad_w, oh_begin, oh_end, relu):
    """Output rows [oh_begin, oh_end) of out (N, K, Ho, Wo) from x (N, C, H, W) and w (K, C, R, S)."""
    C = x.shape[1]
    H = x.shape[2]
    W = x.shape[3]
    K = w.shape[0]
    R = w.shape[2]
    S = w.shape[3]
    Wo = out.shape[3]
    rows = oh_end - oh_begin
    # One output value per thread; a grid smaller than the output steps on (a grid-stride loop).
    for e in range(cuda.grid(1), out.shape[0] * K * rows * Wo, cuda.gridsize(1)):
        n, k, t, ow = unravel4(e, K, rows, Wo)
        oh = oh_begin + t
        acc = float32(0.0)
        for c in range(C):
            for r in range(R):
                ih = oh * stride - pad_top + r
                if ih >= 0 and ih < H:                   # else a row of zero padding
                    for s in range(S):
                        iw = ow * stride - pad_w + s
                        if iw >= 0 and iw < W:
                            acc += w[k, c, r, s] * x[n, c, ih, iw]
        acc += bias[k]
        if relu:
            acc = max(acc, float32(0.0))
        out[n, k, oh, ow] = acc


def default_method(r: int, s: int, stride: int) -> str:
    """The kernel to read on the simulator; on a GPU the fastest for an r x s layer of this stride: Winograd where
    it applies, im2col + GEMM elsewhere (benchmarks/HISTORY.md)."""
    if backend.is_simulator():
        return "naive"
    why_not = conv_winograd.supported(r, s, stride)         # None: Winograd applies
    return "winograd" if why_not is None else "gemm"


def check_method(method: str | None, r: int, s: int, stride: int) -> str:
    """``method``, or by default :func:`default_method` for an r x s layer of this stride."""
    method = method or default_method(r, s, stride)
    if method not in METHODS:
        raise ValueError(f"unknown convolution method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def tile_rows(method: str, r: int) -> int:
    """Output rows ``method`` computes together for an r-row kernel (bands are cut between them): Winograd's
    m x m tiles, one row otherwise."""
    return conv_winograd.TILES[r] if method == "winograd" else 1


class ConvWeights:
    """A layer's weights and bias on the device, in the layout each method reads: (K, C, R, S), the same memory
    as a (K, C*R*S) matrix for im2col + GEMM; Winograd's (alpha^2, K, C) made on first use."""

    def __init__(self, w, bias=None):
        # A copy, not ascontiguousarray: a view such as w[:, :, None, None] counts as contiguous
        # but keeps stride 0 on its new axes, and a GPU array with those strides cannot reshape.
        self.host = np.array(w, dtype=np.float32, order="C")
        if self.host.ndim != 4:
            raise ValueError(f"weights must have shape (K, C, R, S), got {self.host.shape}")
        self.k, self.c, self.r, self.s = self.host.shape
        b = np.zeros(self.k, np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
        if b.shape != (self.k,):
            raise ValueError(f"bias must have shape ({self.k},) to match {self.k} output channels, got {b.shape}")
        self.bias = cuda.to_device(b)
        self.w = cuda.to_device(self.host)
        self.wmat = self.w.reshape(self.k, self.c * self.r * self.s)

    winograd = cached_property(lambda self: cuda.to_device(conv_winograd.filter_transform(self.host)))


def conv_rows_device(x, weights: ConvWeights, out, stride: int, pad_top: int, pad_w: int, oh_begin: int,
                     oh_end: int, relu: bool = False, stream=0, method: str | None = None, workspace=None) -> None:
    """Output rows [oh_begin, oh_end) of ``out`` from the band ``x`` (device arrays); ``workspace``: GEMM and
    Winograd scratch."""
    if oh_end <= oh_begin:
        return
    method = check_method(method, weights.r, weights.s, stride)
    if method == "naive":
        blocks, threads = launch_1d(out.shape[0] * weights.k * (oh_end - oh_begin) * out.shape[3])
        conv2d_kernel[blocks, threads, stream](x, weights.w, weights.bias, out, stride, pad_top, pad_w,
                                               oh_begin, oh_end, bool(relu))
    elif method == "gemm":
        conv_gemm.conv_rows_gemm(x, weights.wmat, weights.bias, out, weights.r, weights.s, stride, pad_top,
                                 pad_w, oh_begin, oh_end, relu, stream, workspace=workspace)
    else:
        why = conv_winograd.supported(weights.r, weights.s, stride)
        if why:
            raise ValueError(f"method='winograd' cannot do {why}; use method='gemm' or 'naive'")
        conv_winograd.conv_rows_winograd(x, weights.winograd, weights.bias, out, weights.r, pad_top, pad_w,
                                         oh_begin, oh_end, relu, stream, workspace=workspace)


def conv2d_device(x, weights: ConvWeights, stride: int = 1, pad: int = 0, relu: bool = False, out=None,
                  stream=0, method: str | None = None):
    """Convolution of a device array (N, C, H, W); returns a device array (N, K, Ho, Wo)."""
    ho, wo = ref.check_conv(x.shape, weights.host.shape, stride, pad)
    if out is None:
        out = cuda.device_array((x.shape[0], weights.k, ho, wo), dtype=np.float32)
    conv_rows_device(x, weights, out, stride, pad, pad, 0, ho, relu, stream, method)
    return out


def conv2d(x, w, stride: int = 1, pad: int = 0, bias=None, relu: bool = False,
           method: str | None = None) -> np.ndarray:
    """2-D convolution (cross-correlation) on the GPU of (C,H,W) or (N,C,H,W) input by w (K, C, R, S)."""
    ref.check_conv(np.shape(x), np.shape(w), stride, pad)
    x4, single = ref.as_batch(np.asarray(x, dtype=np.float32))
    out = conv2d_device(cuda.to_device(np.ascontiguousarray(x4)), ConvWeights(w, bias), stride, pad, relu,
                        method=method).copy_to_host()
    return out[0] if single else out


def linear_device(x, weights: ConvWeights, relu: bool = False, stream=0):
    """A fully connected layer on device rows x (N, D) -> (N, M) on the device: a 1x1 convolution of a 1x1
    image with D channels (im2col + GEMM), ``weights`` being ``ConvWeights(w.reshape(M, D, 1, 1), bias)``."""
    n, d = x.shape
    if d != weights.c:
        raise ValueError(f"fully connected layer: input has {d} features but the weights expect {weights.c}")
    out = conv2d_device(x.reshape(n, d, 1, 1), weights, relu=relu, stream=stream, method="gemm")
    return out.reshape(n, weights.k)


# -- max-pooling ----------------------------------------------------------------
@cuda.jit
def _maxpool_kernel(x, out, size, stride, pad_t, pad_w, oh_begin, oh_end):
    _, C, H, W = x.shape
    Wo = out.shape[3]
    rows = oh_end - oh_begin
    total = x.shape[0] * C * rows * Wo
    for e in range(cuda.grid(1), total, cuda.gridsize(1)):
        n, c, t, ow = unravel4(e, C, rows, Wo)
        oh = oh_begin + t
        best = float32(-math.inf)
        for r in range(size):
            ih = oh * stride - pad_t + r
            if ih >= 0 and ih < H:
                for s in range(size):
                    iw = ow * stride - pad_w + s
                    if iw >= 0 and iw < W:
                        best = max(best, x[n, c, ih, iw])
        out[n, c, oh, ow] = best


def maxpool_rows_device(x, out, size: int, stride: int, pad_top: int, oh_begin: int, oh_end: int,
                        pad_w: int = 0, stream=0) -> None:
    if oh_end <= oh_begin:
        return
    blocks, threads = launch_1d(x.shape[0] * x.shape[1] * (oh_end - oh_begin) * out.shape[3])
    _maxpool_kernel[blocks, threads, stream](x, out, size, stride, pad_top, pad_w, oh_begin, oh_end)


# -- local response normalisation (channel-wise: no spatial halo) ---------------
@cuda.jit(fastmath=True)
def _lrn_kernel(x, out, size, alpha, beta, k):
    _, C, H, W = x.shape
    half = size // 2
    for e in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        n, c, h, w = unravel4(e, C, H, W)
        total = float32(0.0)
        for cc in range(max(0, c - half), min(C, c + half + 1)):
            v = x[n, cc, h, w]
            total += v * v
        out[n, c, h, w] = x[n, c, h, w] / math.pow(k + alpha * total, beta)


def lrn_device(x, size: int, alpha: float, beta: float, k: float, out=None, stream=0):
    out = out if out is not None else cuda.device_array(x.shape, dtype=np.float32)
    blocks, threads = launch_1d(x.size)
    _lrn_kernel[blocks, threads, stream](x, out, size, np.float32(alpha), np.float32(beta), np.float32(k))
    return out

