"""Convolution, max-pooling, LRN and fully connected layers as Numba CUDA kernels.

The convolution is direct (no im2col buffer) and tiled through shared memory:

- a block computes a tile of output pixels (TH rows x TW columns of one
  image) for a group of BM output channels;
- the reduction runs over chunks of CC input channels x one kernel row r:
  the block stages the input rows that chunk needs (the tile plus its halo,
  (TW-1)*stride + S columns wide) and the weights [CC, S, BM] in shared memory;
- each thread keeps PX pixels x KX output channels of accumulators in
  registers, so every value read from shared memory feeds several
  multiply-adds (register blocking). Lanes of a warp take consecutive pixels
  (coalesced loads and stores, conflict-free shared reads); all lanes of a
  warp share the same output channels (weight reads are broadcasts).

A second path, ``method="gemm"`` (:mod:`hpclab.halo.conv_gemm`), unrolls
the input patches (im2col) and multiplies by the weight matrix with the
register-blocked GEMM of :mod:`hpclab.matmul.kernels`: several times faster
on a GPU, and the default there. The direct kernel is the one to read (and
the simulator's default); ``default_method()`` says which is used. A third,
``method="winograd"`` (:mod:`hpclab.halo.conv_winograd`), does stride-1
3x3 and 5x5 layers with 2.3-2.8 times fewer multiplications; its results
depend on where tiles start, so it is not the default.

The sum over (c, r, s) runs in the same order whatever the tile or the band
of rows, so a band computed on one rank is bit-for-bit the same as those rows
computed on one GPU: the distributed versions can be checked exactly.

Rows: every kernel computes output rows [oh_begin, oh_end) of a band whose
input row ``oh * stride - pad_top + r`` is local row index; rows outside the
band are zero (padding, or beyond the image edge). ``pad_top = pad`` and the
full image gives the ordinary layer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hpclab import backend
from hpclab.backend import cuda as _cuda
from hpclab.halo import reference as ref
from hpclab.launch import launch_1d, unravel4

cuda = _cuda()
from numba import float32, int32  # noqa: E402  (after the backend is chosen)

SHARED_FLOATS = 11776          # 46 KiB: below the 48 KiB static shared-memory limit
FASTMATH = True


@dataclass(frozen=True)
class ConvConfig:
    """Launch shape: LANES x NTY threads; each PX pixels x KX output channels."""
    lanes: int
    nty: int
    px: int
    kx: int
    cc: int                    # input channels per shared-memory chunk

    @property
    def threads(self) -> int:
        return self.lanes * self.nty

    @property
    def bm(self) -> int:       # output channels per block
        return self.nty * self.kx

    @property
    def slots(self) -> int:    # output pixels per block
        return self.lanes * self.px


GPU_CONFIGS = {
    "8x8": ConvConfig(lanes=32, nty=8, px=8, kx=8, cc=8),     # 256 px x 64 ch per block
    "4x8": ConvConfig(lanes=32, nty=8, px=4, kx=8, cc=8),     # 128 px x 64 ch
    "8x4": ConvConfig(lanes=32, nty=8, px=8, kx=4, cc=8),     # 256 px x 32 ch
}
# The simulator runs one Python thread per CUDA thread: few, small blocks.
SIM_CONFIG = ConvConfig(lanes=8, nty=2, px=2, kx=2, cc=4)


METHODS = ("direct", "gemm", "winograd")


def default_method() -> str:
    """im2col + GEMM on a GPU (fastest); the direct teaching kernel on the simulator."""
    return "direct" if backend.is_simulator() else "gemm"


def check_method(method: str | None) -> str:
    method = method or default_method()
    if method not in METHODS:
        raise ValueError(f"unknown convolution method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def default_config(k: int) -> ConvConfig:
    if backend.is_simulator():
        return SIM_CONFIG
    # 64 output channels per block unless that wastes a large part of a block.
    return GPU_CONFIGS["8x8"] if k % 64 == 0 or k > 256 else GPU_CONFIGS["8x4"]


@dataclass(frozen=True)
class TilePlan:
    """Tile geometry of one layer; depends on the layer, never on the band."""
    config: ConvConfig
    s: int
    stride: int
    cc: int
    th: int
    tw: int
    wwin: int
    in_max: int

    def tiles(self, rows: int, wo: int) -> tuple[int, int]:
        return -(-rows // self.th), -(-wo // self.tw)


def plan_tiles(c: int, wo: int, s: int, stride: int, config: ConvConfig) -> TilePlan:
    """Tile height/width and channel chunk that fit the shared-memory budget."""
    tw = min(wo, config.slots)
    th = max(1, config.slots // tw)
    cc = max(1, min(config.cc, c))

    def need(cc_, th_, tw_):
        wwin_ = (tw_ - 1) * stride + s
        return cc_ * th_ * wwin_ + cc_ * s * config.bm, wwin_

    while need(cc, th, tw)[0] > SHARED_FLOATS:
        if th > 1:
            th -= 1
        elif cc > 1:
            cc = max(1, cc // 2)
        elif tw > 1:
            tw = max(1, tw // 2)
        else:
            raise ValueError(f"a {s}-wide kernel with stride {stride} does not fit in shared memory")
    total, wwin = need(cc, th, tw)
    in_max = -(-(cc * th * wwin) // 256) * 256      # round up: fewer distinct kernels
    in_max = min(in_max, SHARED_FLOATS - cc * s * config.bm)
    return TilePlan(config, s, stride, cc, th, tw, wwin, in_max)


@lru_cache(maxsize=None)
def _conv_kernel(s_, stride_, lanes_, nty_, px_, kx_, cc_, in_max_, relu_):
    # Geometry that the inner loops depend on is baked in as constants, so
    # the compiler unrolls them and keeps the accumulators in registers.
    S, STRIDE, LANES, NTY, PX, KX, CC, IN_MAX, RELU = (s_, stride_, lanes_, nty_, px_, kx_, cc_,
                                                       in_max_, relu_)
    BM = NTY * KX
    NT = LANES * NTY
    W_SIZE = CC * S * BM
    W_ITERS = (W_SIZE + NT - 1) // NT

    @cuda.jit(fastmath=FASTMATH)
    def conv_tile(x, wt, bias, out, R, pad_t, pad_w, oh_begin, oh_end, TH, TW, tiles_w, Wwin):
        in_sh = cuda.shared.array(IN_MAX, dtype=float32)
        w_sh = cuda.shared.array(W_SIZE, dtype=float32)
        acc = cuda.local.array((PX, KX), dtype=float32)
        a = cuda.local.array(PX, dtype=float32)
        b = cuda.local.array(KX, dtype=float32)
        off = cuda.local.array(PX, dtype=int32)
        tid = cuda.threadIdx.x
        lane = tid % LANES
        ty = tid // LANES
        tile = cuda.blockIdx.x
        n = cuda.blockIdx.y
        k0 = cuda.blockIdx.z * BM
        th0 = oh_begin + (tile // tiles_w) * TH
        tw0 = (tile % tiles_w) * TW
        C = x.shape[1]
        H = x.shape[2]
        W = x.shape[3]
        K = wt.shape[3]
        Wo = out.shape[3]
        slots = TH * TW
        plane = TH * Wwin
        for i in range(PX):
            q = lane + LANES * i
            t = q // TW
            off[i] = t * Wwin + (q - t * TW) * STRIDE if q < slots else 0
            for j in range(KX):
                acc[i, j] = float32(0.0)
        ih0 = th0 * STRIDE - pad_t
        iw0 = tw0 * STRIDE - pad_w
        for c0 in range(0, C, CC):
            for r in range(R):
                # Input rows of this chunk: CC channels x TH rows, Wwin wide (tile + halo).
                for row in range(ty, CC * TH, NTY):
                    cc = row // TH
                    c = c0 + cc
                    ih = ih0 + (row - cc * TH) * STRIDE + r
                    inside = c < C and ih >= 0 and ih < H
                    for col in range(lane, Wwin, LANES):
                        iw = iw0 + col
                        v = float32(0.0)
                        if inside and iw >= 0 and iw < W:
                            v = x[n, c, ih, iw]
                        in_sh[row * Wwin + col] = v
                # Weights of this chunk: [CC, S, BM], from the (C, R, S, K) layout.
                for it in range(W_ITERS):
                    e = tid + it * NT
                    if e < W_SIZE:
                        cs = e // BM
                        m = e - cs * BM
                        cc = cs // S
                        c = c0 + cc
                        kk = k0 + m
                        v = float32(0.0)
                        if c < C and kk < K:
                            v = wt[c, r, cs - cc * S, kk]
                        w_sh[e] = v
                cuda.syncthreads()
                for cc in range(CC):
                    base = cc * plane
                    for sx in range(S):
                        for i in range(PX):
                            a[i] = in_sh[base + off[i] + sx]
                        wb = (cc * S + sx) * BM + ty * KX
                        for j in range(KX):
                            b[j] = w_sh[wb + j]
                        for i in range(PX):
                            for j in range(KX):
                                acc[i, j] += a[i] * b[j]
                cuda.syncthreads()
        rows = oh_end - th0
        cols = Wo - tw0
        for i in range(PX):
            q = lane + LANES * i
            t = q // TW
            u = q - t * TW
            if q < slots and t < rows and u < cols:
                for j in range(KX):
                    kk = k0 + ty * KX + j
                    if kk < K:
                        v = acc[i, j] + bias[kk]
                        if RELU:
                            v = max(v, float32(0.0))
                        out[n, kk, th0 + t, tw0 + u] = v

    return conv_tile


def kernel_for(plan: TilePlan, relu: bool):
    cfg = plan.config
    return _conv_kernel(plan.s, plan.stride, cfg.lanes, cfg.nty, cfg.px, cfg.kx, plan.cc,
                        plan.in_max, bool(relu))


# -- weights ------------------------------------------------------------------
@dataclass
class ConvWeights:
    """Weights on the device in (C, R, S, K) order (output channel fastest:
    coalesced loads into shared memory) for the direct kernel, as a
    (K, C*R*S) matrix for the GEMM path, with the bias; Winograd-transformed
    (alpha^2, K, C) on the first use of that path (``winograd()``)."""
    wt: object
    bias: object
    k: int
    c: int
    r: int
    s: int
    wmat: object = None
    host: np.ndarray | None = None
    _wino: object = None

    def winograd(self):
        if self._wino is None:
            from hpclab.halo.conv_winograd import filter_transform

            self._wino = cuda.to_device(filter_transform(self.host))
        return self._wino


def prepare_weights(w, bias=None) -> ConvWeights:
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 4:
        raise ValueError(f"weights must have shape (K, C, R, S), got {w.shape}")
    k, c, r, s = w.shape
    b = np.zeros(k, np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
    if b.shape != (k,):
        raise ValueError(f"bias must have shape ({k},) to match {k} output channels, got {b.shape}")
    wt = cuda.to_device(np.ascontiguousarray(w.transpose(1, 2, 3, 0)))
    wmat = cuda.to_device(np.ascontiguousarray(w.reshape(k, c * r * s)))
    return ConvWeights(wt, cuda.to_device(b), k, c, r, s, wmat, w.copy())  # host copy: Winograd on demand


# -- convolution on device arrays ---------------------------------------------
def conv_rows_device(x, weights: ConvWeights, out, stride: int, pad_top: int, pad_w: int,
                     oh_begin: int, oh_end: int, relu: bool = False, plan: TilePlan | None = None,
                     stream=0, method: str | None = None, workspace=None) -> None:
    """Compute output rows [oh_begin, oh_end) of ``out`` (N, K, Ho, Wo) from the band ``x``."""
    if oh_end <= oh_begin:
        return
    method = check_method(method)
    if method == "winograd":
        from hpclab.halo import conv_winograd as wg

        why = wg.supported(weights.r, weights.s, stride)
        if why:
            raise ValueError(f"method='winograd' cannot do {why}; use method='gemm' or 'direct'")
        wg.conv_rows_winograd(x, weights.winograd(), weights.bias, out, weights.r, pad_top, pad_w, oh_begin,
                              oh_end, relu, stream, workspace=workspace)
        return
    if method == "gemm":
        from hpclab.halo.conv_gemm import conv_rows_gemm

        conv_rows_gemm(x, weights.wmat, weights.bias, out, weights.r, weights.s, stride, pad_top, pad_w,
                       oh_begin, oh_end, relu, stream, workspace=workspace)
        return
    n, c, _, _ = x.shape
    wo = out.shape[3]
    plan = plan or plan_tiles(c, wo, weights.s, stride, default_config(weights.k))
    tiles_h, tiles_w = plan.tiles(oh_end - oh_begin, wo)
    grid = (tiles_h * tiles_w, n, -(-weights.k // plan.config.bm))
    kernel = kernel_for(plan, relu)
    kernel[grid, plan.config.threads, stream](
        x, weights.wt, weights.bias, out, weights.r, pad_top, pad_w, oh_begin, oh_end,
        plan.th, plan.tw, tiles_w, plan.wwin)


def conv2d_device(x, weights: ConvWeights, stride: int = 1, pad: int = 0, relu: bool = False,
                  config: ConvConfig | None = None, out=None, stream=0, method: str | None = None):
    """Convolution of a device array (N, C, H, W); returns a device array (N, K, Ho, Wo).

    ``method``: "direct" (tiled kernel, ``config`` its launch shape), "gemm"
    (im2col + register-blocked GEMM) or "winograd" (stride 1, 3x3 or 5x5);
    default ``default_method()``.
    """
    n, c, h, w = x.shape
    ho, wo = ref.check_conv(x.shape, (weights.k, weights.c, weights.r, weights.s), stride, pad)
    if out is None:
        out = cuda.device_array((n, weights.k, ho, wo), dtype=np.float32)
    method = check_method(method)
    plan = plan_tiles(c, wo, weights.s, stride, config or default_config(weights.k)) \
        if method == "direct" else None
    conv_rows_device(x, weights, out, stride, pad, pad, 0, ho, relu, plan, stream, method)
    return out


def conv2d(x, w, stride: int = 1, pad: int = 0, bias=None, relu: bool = False,
           method: str | None = None) -> np.ndarray:
    """2-D convolution (cross-correlation) on the GPU of (C,H,W) or (N,C,H,W) input.

    ``w`` has shape (K, C, R, S). Returns a NumPy array (K,Ho,Wo) or (N,K,Ho,Wo).
    ``method``: "direct", "gemm" (im2col + GEMM) or "winograd" (stride 1, 3x3
    or 5x5 kernels); default ``default_method()``.
    """
    x = np.asarray(x, dtype=np.float32)
    ref.check_conv(x.shape, np.shape(w), stride, pad)
    method = check_method(method)
    x4, single = ref.as_batch(x)
    out = conv2d_device(cuda.to_device(np.ascontiguousarray(x4)), prepare_weights(w, bias),
                        stride, pad, relu, method=method).copy_to_host()
    return out[0] if single else out


# -- max-pooling ----------------------------------------------------------------
@cuda.jit
def _maxpool_kernel(x, out, size, stride, pad_t, pad_w, oh_begin, oh_end):
    C = x.shape[1]
    H = x.shape[2]
    W = x.shape[3]
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


def maxpool2d_device(x, size: int = 3, stride: int = 2, pad: int = 0, stream=0):
    n, c, h, w = x.shape
    ref.check_window(h, w, size, size, stride, pad, what="pooling window")
    ho, wo = ref.output_size(h, size, stride, pad), ref.output_size(w, size, stride, pad)
    out = cuda.device_array((n, c, ho, wo), dtype=np.float32)
    maxpool_rows_device(x, out, size, stride, pad, 0, ho, pad, stream)
    return out


def maxpool2d(x, size: int = 3, stride: int = 2, pad: int = 0) -> np.ndarray:
    x4, single = ref.as_batch(np.asarray(x, dtype=np.float32))
    out = maxpool2d_device(cuda.to_device(np.ascontiguousarray(x4)), size, stride, pad).copy_to_host()
    return out[0] if single else out


# -- local response normalisation (channel-wise: no spatial halo) ---------------
@cuda.jit(fastmath=FASTMATH)
def _lrn_kernel(x, out, size, alpha, beta, k):
    C = x.shape[1]
    H = x.shape[2]
    W = x.shape[3]
    half = size // 2
    for e in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        n, c, h, w = unravel4(e, C, H, W)
        total = float32(0.0)
        for cc in range(max(0, c - half), min(C, c + half + 1)):
            v = x[n, cc, h, w]
            total += v * v
        out[n, c, h, w] = x[n, c, h, w] / math.pow(k + alpha * total, beta)


def lrn_device(x, size: int = ref.LRN_SIZE, alpha: float = ref.LRN_ALPHA, beta: float = ref.LRN_BETA,
               k: float = ref.LRN_K, out=None, stream=0):
    out = out if out is not None else cuda.device_array(x.shape, dtype=np.float32)
    blocks, threads = launch_1d(x.size)
    _lrn_kernel[blocks, threads, stream](x, out, size, np.float32(alpha), np.float32(beta), np.float32(k))
    return out


def lrn(x, size: int = ref.LRN_SIZE, alpha: float = ref.LRN_ALPHA, beta: float = ref.LRN_BETA,
        k: float = ref.LRN_K) -> np.ndarray:
    x4, single = ref.as_batch(np.asarray(x, dtype=np.float32))
    out = lrn_device(cuda.to_device(np.ascontiguousarray(x4)), size, alpha, beta, k).copy_to_host()
    return out[0] if single else out


# -- fully connected: a shared-memory tiled GEMM, y = x w^T + b ------------------
@lru_cache(maxsize=None)
def _linear_kernel(tile_, relu_):
    TILE, RELU = tile_, relu_
    PADDED = TILE + 1                                   # +1: no bank conflicts

    @cuda.jit(fastmath=FASTMATH)
    def linear(x, w, bias, out):
        xs = cuda.shared.array((TILE, TILE), dtype=float32)
        ws = cuda.shared.array((TILE, PADDED), dtype=float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * TILE + ty          # sample
        col = cuda.blockIdx.x * TILE + tx          # output feature
        wrow = cuda.blockIdx.x * TILE + ty
        N = x.shape[0]
        D = x.shape[1]
        M = w.shape[0]
        acc = float32(0.0)
        for d0 in range(0, D, TILE):
            d = d0 + tx
            xs[ty, tx] = x[row, d] if row < N and d < D else float32(0.0)
            ws[ty, tx] = w[wrow, d] if wrow < M and d < D else float32(0.0)
            cuda.syncthreads()
            for dd in range(TILE):
                acc += xs[ty, dd] * ws[tx, dd]
            cuda.syncthreads()
        if row < N and col < M:
            v = acc + bias[col]
            if RELU:
                v = max(v, float32(0.0))
            out[row, col] = v

    return linear


def linear_device(x, w, bias, relu: bool = False, stream=0):
    """x (N, D) and w (M, D) device arrays, bias (M,): returns (N, M) on the device."""
    n, d = x.shape
    m, dw = w.shape
    if d != dw:
        raise ValueError(f"fully connected layer: input has {d} features but the weights expect {dw}")
    tile = 8 if backend.is_simulator() else 16
    out = cuda.device_array((n, m), dtype=np.float32)
    _linear_kernel(tile, bool(relu))[(-(-m // tile), -(-n // tile)), (tile, tile), stream](x, w, bias, out)
    return out
