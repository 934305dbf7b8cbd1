"""Convolution as a matrix product: im2col + the warp-tiled GEMM.

For output rows [t0, t1) of a band and a group of images, the input patches are unrolled into a matrix,
``col[(c, r, s), (n, t, q)] = x[n, c, t*stride - pad_top + r, q*stride - pad_w + s]`` (zero outside the
band or the image), so the convolution is one product W[K, C*R*S] @ col by ``hpclab.matmul.warp``'s
kernel (K in one slice); a small kernel adds the bias, applies ReLU and writes the (N, K, Ho, Wo) output. The
buffers cost 4 (C*R*S + K) bytes per output pixel, so a layer runs in chunks of images (or rows of one image)
under ``max_bytes()``. Every output is the same dot product summed in the same order whatever its chunk or band:
a band computed on one rank is bit for bit those rows of the whole image.
"""
from __future__ import annotations

import numpy as np

from hpclab import backend, launch
from hpclab.backend import cuda as _cuda
from hpclab.matmul import warp

cuda = _cuda()
from numba import float32  # noqa: E402

DEFAULT_MAX_BYTES = 512 << 20        # im2col + product buffers per chunk on a GPU
SIM_MAX_BYTES = 64 << 10             # the simulator: small chunks (and tests of the chunking)


def max_bytes() -> int:
    """The im2col and product buffers' bytes per chunk."""
    return backend.auto_size(DEFAULT_MAX_BYTES, SIM_MAX_BYTES)


@cuda.jit
def _im2col_kernel(x, col, n0, t0, rows, stride, pad_t, pad_w, R, S, Wo):
    # Rows of col (one (c, r, s) each) along the grid's y; along a row, consecutive
    # threads take consecutive output pixels (coalesced stores). Two integer
    # divisions per element: divisions are what this kernel spends its time on.
    _, C, H, W = x.shape
    ncol = col.shape[1]
    per_image = rows * Wo
    for crs in range(cuda.blockIdx.y, col.shape[0], cuda.gridDim.y):
        t = crs // S
        s = crs - t * S
        c = t // R
        r = t - c * R
        for j in range(cuda.grid(1), ncol, cuda.gridsize(1)):
            n = j // per_image
            p = j - n * per_image
            q = p // Wo
            ih = (t0 + q) * stride - pad_t + r
            iw = (p - q * Wo) * stride - pad_w + s
            v = float32(0.0)
            if c < C and ih >= 0 and ih < H and iw >= 0 and iw < W:
                v = x[n0 + n, c, ih, iw]
            col[crs, j] = v


@cuda.jit
def _scatter_kernel(mat, bias, out, n0, t0, rows, relu):
    # out[n0 + n, k, t0 + t, q] = mat[k, (n * rows + t) * Wo + q] + bias[k] (then ReLU);
    # output channels along the grid's y.
    ncol = mat.shape[1]
    Wo = out.shape[3]
    per_image = rows * Wo
    for k in range(cuda.blockIdx.y, mat.shape[0], cuda.gridDim.y):
        b = bias[k]
        for j in range(cuda.grid(1), ncol, cuda.gridsize(1)):
            n = j // per_image
            p = j - n * per_image
            q = p // Wo
            v = mat[k, j] + b
            if relu and v < float32(0.0):
                v = float32(0.0)
            out[n0 + n, k, t0 + q, p - q * Wo] = v


class Workspace:
    """Reused flat device buffers: no allocation per call (allocation syncs the GPU). Views are kept
    too: making a device-array view costs the host tens of microseconds, a lot beside a few kernels."""

    def __init__(self):
        self._bufs: dict[str, object] = {}
        self._views: dict[tuple, object] = {}

    def array(self, name: str, shape: tuple):
        """A float32 device array of ``shape`` on the buffer ``name`` (grown when too small)."""
        key = (name, tuple(shape))
        view = self._views.get(key)
        if view is None:
            need = int(np.prod(shape))
            buf = self._bufs.get(name)
            if buf is None or buf.size < need:
                # Zeroed, not empty: the products run over columns padded to whole tiles, never read back,
                # and garbage there (NaN on the simulator) made NumPy warn. A synchronous copy, done before
                # any stream (the halo executors' are non-blocking) can use the buffer.
                buf = self._bufs[name] = cuda.to_device(np.zeros(need, dtype=np.float32))
                self._views = {k: v for k, v in self._views.items() if k[0] != name}
            view = self._views[key] = buf[:need].reshape(*shape)
        return view


WORKSPACE = Workspace()          # for callers without their own


def chunks(n: int, rows: int, wo: int, per_col_bytes: int, limit: int):
    """(first image, images, first row, rows) pieces whose buffers stay under ``limit`` bytes."""
    cols_max = max(wo, limit // per_col_bytes)
    if rows * wo <= cols_max:                 # whole images, as many as fit
        step = cols_max // (rows * wo)
        for n0 in range(0, n, step):
            yield n0, min(step, n - n0), 0, rows
    else:                                     # rows of one image at a time
        step = cols_max // wo
        for n0 in range(n):
            for r0 in range(0, rows, step):
                yield n0, 1, r0, min(step, rows - r0)


def conv_rows_gemm(x, wmat, bias, out, r: int, s: int, stride: int, pad_top: int, pad_w: int,
                   oh_begin: int, oh_end: int, relu: bool = False, stream=0,
                   workspace: Workspace | None = None) -> None:
    """Output rows [oh_begin, oh_end) of ``out`` (N, K, Ho, Wo) from the band ``x`` by im2col + GEMM;
    ``wmat``: the weights as a (K, C*R*S) device matrix, ``bias`` (K,)."""
    if oh_end <= oh_begin:
        return
    n = x.shape[0]
    k, crs = wmat.shape
    wo = out.shape[3]
    ws = workspace or WORKSPACE
    for n0, nb, r0, rows in chunks(n, oh_end - oh_begin, wo, 4 * (crs + k), max_bytes()):
        t0 = oh_begin + r0
        cols = nb * rows * wo
        col = ws.array("col", (crs, cols))
        mat = ws.array("mat", (k, cols))
        blocks, threads = launch.launch_2d(crs, cols)
        _im2col_kernel[blocks, threads, stream](x, col, n0, t0, rows, stride, pad_top, pad_w, r, s, wo)
        # the planned tile shape, K in one slice: the same sums in every chunk and band
        warp.launch(wmat, col, mat, warp.plan(k, cols, crs)[0], stream=stream, split=1)
        blocks, threads = launch.launch_2d(k, cols)
        _scatter_kernel[blocks, threads, stream](mat, bias, out, n0, t0, rows, bool(relu))
