"""The direct convolution, tiled: shared memory and register blocking (the ``direct`` rows of
``python -m benchmarks conv throughput`` and of notebook 06's recorded roofline).

The plain kernel's sum (:func:`hpclab.halo.conv.conv2d_kernel`), arranged for speed: a block computes TH x TW
output pixels of one image for BM output channels; the reduction runs over chunks of CC input channels x one
kernel row, whose input rows (the tile and its halo, (TW-1)*stride + S columns) and weights [CC, S, BM] the
block stages in shared memory; each thread keeps PX pixels x KX channels of sums in registers, so every value
read from shared memory feeds several multiply-adds. A warp's lanes take consecutive pixels (coalesced,
conflict-free) and share their output channels (weight reads are broadcasts). The kernel is built per layer
geometry so that its inner loops unroll. Every output is summed in the same order whatever the tile or band.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hpclab import backend, roofline
from hpclab.backend import cuda as _cuda
from hpclab.halo import reference as ref
from hpclab.halo.measure import c2_operands
from hpclab.timing import median_time

cuda = _cuda()
from numba import float32, int32  # noqa: E402  (after the backend is chosen)

SHARED_FLOATS = 11776          # 46 KiB: below the 48 KiB static shared-memory limit


@dataclass(frozen=True)
class ConvConfig:
    """Launch shape: LANES x NTY threads; each PX pixels x KX output channels."""
    lanes: int
    nty: int
    px: int
    kx: int
    cc: int                    # input channels per shared-memory chunk

    threads = property(lambda self: self.lanes * self.nty)
    bm = property(lambda self: self.nty * self.kx)          # output channels per block
    slots = property(lambda self: self.lanes * self.px)     # output pixels per block


GPU_CONFIGS = {
    "8x8": ConvConfig(lanes=32, nty=8, px=8, kx=8, cc=8),     # 256 px x 64 ch per block
    "4x8": ConvConfig(lanes=32, nty=8, px=4, kx=8, cc=8),     # 128 px x 64 ch
    "8x4": ConvConfig(lanes=32, nty=8, px=8, kx=4, cc=8),     # 256 px x 32 ch
}
# The simulator runs one Python thread per CUDA thread: few, small blocks.
SIM_CONFIG = ConvConfig(lanes=8, nty=2, px=2, kx=2, cc=4)


def default_config(k: int) -> ConvConfig:
    """64 output channels per block unless that wastes a large part of a block."""
    gpu = GPU_CONFIGS["8x8"] if k % 64 == 0 or k > 256 else GPU_CONFIGS["8x4"]
    return backend.auto_size(gpu, SIM_CONFIG)


@dataclass(frozen=True)
class TilePlan:
    """Tile geometry of one layer; depends on the layer, never on the band."""
    config: ConvConfig
    cc: int
    th: int
    tw: int
    wwin: int
    in_max: int


def plan_tiles(c: int, wo: int, s: int, stride: int, config: ConvConfig) -> TilePlan:
    """Tile height/width and channel chunk that fit the shared-memory budget."""
    tw = min(wo, config.slots)
    th = max(1, config.slots // tw)
    cc = max(1, min(config.cc, c))

    def need(cc_, th_, tw_):      # floats of shared memory: input rows with their halo, and weights
        return cc_ * th_ * ((tw_ - 1) * stride + s) + cc_ * s * config.bm

    while need(cc, th, tw) > SHARED_FLOATS:
        if th > 1:
            th -= 1
        elif cc > 1:
            cc = max(1, cc // 2)
        elif tw > 1:
            tw = max(1, tw // 2)
        else:
            raise ValueError(f"a {s}-wide kernel with stride {stride} does not fit in shared memory")
    wwin = (tw - 1) * stride + s
    in_max = -(-(cc * th * wwin) // 256) * 256      # round up: fewer distinct kernels
    in_max = min(in_max, SHARED_FLOATS - cc * s * config.bm)
    return TilePlan(config, cc, th, tw, wwin, in_max)


@lru_cache(maxsize=None)
def _conv_kernel(S, STRIDE, LANES, NTY, PX, KX, CC, IN_MAX, RELU):
    # Geometry that the inner loops depend on is baked in as constants, so
    # the compiler unrolls them and keeps the accumulators in registers.
    BM = NTY * KX
    NT = LANES * NTY
    W_SIZE = CC * S * BM
    W_ITERS = (W_SIZE + NT - 1) // NT

    @cuda.jit(fastmath=True)
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
        _, C, H, W = x.shape
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


def conv_rows_tiled(x, wt, bias, out, stride: int, pad_top: int, pad_w: int, oh_begin: int, oh_end: int,
                    relu: bool = False, stream=0, config: ConvConfig | None = None) -> None:
    """Output rows [oh_begin, oh_end) of ``out`` (N, K, Ho, Wo) from the band ``x``; ``wt`` (C, R, S, K).
    The tile plan depends on the layer only, so every band of a layer runs the same kernel."""
    n, c = x.shape[0], x.shape[1]
    _, r, s, k = wt.shape
    wo = out.shape[3]
    plan = plan_tiles(c, wo, s, stride, config or default_config(k))
    cfg = plan.config
    kernel = _conv_kernel(s, stride, cfg.lanes, cfg.nty, cfg.px, cfg.kx, plan.cc, plan.in_max, bool(relu))
    tiles_h, tiles_w = -(-(oh_end - oh_begin) // plan.th), -(-wo // plan.tw)
    kernel[(tiles_h * tiles_w, n, -(-k // cfg.bm)), cfg.threads, stream](
        x, wt, bias, out, r, pad_top, pad_w, oh_begin, oh_end, plan.th, plan.tw, tiles_w, plan.wwin)


def device_weights(w):
    """Weights (K, C, R, S) on the device as (C, R, S, K), output channel fastest: coalesced loads into
    shared memory."""
    return cuda.to_device(np.ascontiguousarray(np.asarray(w, dtype=np.float32).transpose(1, 2, 3, 0)))


def conv2d(x, w, stride: int = 1, pad: int = 0, bias=None, relu: bool = False,
           config: ConvConfig | None = None) -> np.ndarray:
    """2-D convolution (cross-correlation) of (N, C, H, W) input by w (K, C, R, S) with the tiled kernel, as
    :func:`hpclab.halo.conv.conv2d` with the others."""
    ho, wo = ref.check_conv(np.shape(x), np.shape(w), stride, pad)
    k = np.shape(w)[0]
    b = np.zeros(k, np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
    out = cuda.device_array((np.shape(x)[0], k, ho, wo), dtype=np.float32)
    conv_rows_tiled(cuda.to_device(np.ascontiguousarray(x, dtype=np.float32)), device_weights(w), cuda.to_device(b),
                    out, stride, pad, pad, 0, ho, relu, config=config)
    return out.copy_to_host()


def traffic(n: int, c: int, h: int, k: int, r: int, pad: int) -> tuple[float, float, str]:
    """FLOPs and bytes, no cache, of a stride-1 convolution (n, c, h, h) by (k, c, r, r), as
    :func:`hpclab.halo.measure.conv_traffic`: per block tile its input rows with halo and its weights."""
    ho = ref.output_size(h, r, 1, pad)
    plan = plan_tiles(c, ho, r, 1, default_config(k))
    tiles = n * -(-ho // plan.th) * -(-ho // plan.tw) * -(-k // plan.config.bm)
    per_tile = c * r * (plan.th * plan.wwin + r * plan.config.bm)
    return (float(ref.conv_flops(n, k, c, r, r, ho, ho)), 4.0 * (tiles * per_tile + k * n * ho * ho),
            f"{plan.th}x{plan.tw} px x {plan.config.bm} ch tiles")


def roofline_point(batch: int = 32, repeats: int = 3) -> roofline.Point:
    """The direct kernel's point on notebook 06's roofline: AlexNet's C2 (:func:`hpclab.halo.measure.c2_operands`)."""
    xh, wt = c2_operands(batch)
    (n, c, h, _), k = xh.shape, wt.shape[0]
    x, wd, bias = cuda.to_device(xh), device_weights(wt), cuda.to_device(np.zeros(k, np.float32))
    out = cuda.device_array((n, k, h, h), np.float32)
    seconds = median_time(lambda: conv_rows_tiled(x, wd, bias, out, 1, 2, 2, 0, h), repeats)
    flops, nbytes, how = traffic(n, c, h, k, 5, 2)
    return roofline.point("direct", flops, nbytes, seconds, how, "06")
