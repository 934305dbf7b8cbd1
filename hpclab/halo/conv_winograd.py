"""Winograd convolution F(m x m, r x r) (Lavin and Gray, CVPR 2016): stride-1 layers, fewer multiplications.

A tile of m x m outputs is Y = A^T [(G g G^T) * (B^T d B)] A, with d the alpha x alpha input patch
(alpha = m + r - 1), g the r x r filter and * the element-wise product: alpha^2 multiplications instead
of m^2 r^2 (F(4x4, 5x5): 64 instead of 400). Summed over input channels, each of the alpha^2 positions is
a matrix product M[xi] (K x tiles) = U[xi] (K x C) @ V[xi] (C x tiles): the filters are transformed once
(host, float64), the input patches by one kernel, the alpha^2 products in one launch of the batched warp
kernel (:mod:`hpclab.matmul.warp`), and the result back with bias and ReLU by another. A^T and G come from
Toom-Cook interpolation at 0, 1, -1, 2, -2, 1/2, -1/2 (the first alpha - 1) and infinity, B^T solved so
that the formula is exact.

``TILES`` holds m (for 5x5 layers F(4x4), the fastest: benchmarks/HISTORY.md). A value depends on where its
tile starts, so the halo versions cut bands between whole tiles of the image (:mod:`hpclab.halo.geometry`),
and a band is then bit for bit those rows of the whole.
"""
from __future__ import annotations

import math
import weakref
from functools import lru_cache

import numpy as np

from hpclab import backend
from hpclab.backend import cuda as _cuda
from hpclab.matmul import warp
from hpclab.halo.conv_gemm import WORKSPACE, Workspace, chunks, max_bytes
from hpclab.launch import launch_1d

cuda = _cuda()
from numba import float32, int64  # noqa: E402  (after the backend is chosen)

TILES = {3: 2, 5: 4}          # outputs per tile side m for each kernel size r: F(m x m, r x r)
POINTS = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5)   # the first alpha - 1 are used, then infinity


def supported(r: int, s: int, stride: int) -> str | None:
    """Why a layer cannot use this path (None when it can)."""
    if stride != 1:
        return f"stride {stride} (Winograd needs stride 1)"
    if r != s or r not in TILES:
        return f"a {r}x{s} kernel (this Winograd path takes square {' or '.join(f'{k}x{k}' for k in TILES)})"
    return None


@lru_cache(maxsize=None)
def transforms(m: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T, G, B^T) of F(m, r) in float64: shapes (m, alpha), (alpha, r), (alpha, alpha)."""
    alpha = m + r - 1
    pts = POINTS[:alpha - 1]                # too few for a larger F(m, r): the exactness check below says so
    at, g = np.zeros((m, alpha)), np.zeros((alpha, r))
    for j, p in enumerate(pts):
        at[:, j] = [p ** i for i in range(m)]
        g[j] = [p ** k / np.prod([p - q for q in pts if q != p]) for k in range(r)]
    at[m - 1, alpha - 1] = g[alpha - 1, r - 1] = 1.0          # the point at infinity
    # Exactness: sum_j AT[i, j] G[j, k] BT[j, l] = [l == i + k] for all i, k, l.
    phi = np.array([at[i] * g[:, k] for i in range(m) for k in range(r)])
    want = np.array([[float(l == i + k) for l in range(alpha)] for i in range(m) for k in range(r)])
    bt = np.linalg.lstsq(phi, want, rcond=None)[0]
    if not np.allclose(phi @ bt, want, atol=1e-12):
        raise ValueError(f"no exact Winograd transform F({m}, {r}) at points {pts}")
    return at, g, np.round(bt, 12)


def filter_transform(w: np.ndarray, m: int | None = None) -> np.ndarray:
    """U[xi * alpha + nu, k, c] = (G w[k, c] G^T)[xi, nu], float32, computed in float64 (m: TILES[r])."""
    k, c, r, _ = w.shape
    g = transforms(m or TILES[r], r)[1]
    u = np.einsum("ia,kcab,jb->ijkc", g, np.asarray(w, np.float64), g)
    return np.ascontiguousarray(u.reshape(-1, k, c), dtype=np.float32)


@cuda.jit(device=True)
def _tile_origin(t, per_image, tiles_w, m, row0):
    """(image, first output row, first output column) of tile number ``t`` of a chunk."""
    n = t // per_image
    tile = t - n * per_image
    ty = tile // tiles_w
    return n, row0 + ty * m, (tile - ty * tiles_w) * m


def _add_row(mat: np.ndarray):
    """A device function acc += outer(mat[:, i], mat @ row) for a constant matrix ``mat``: row i of a tile X
    through both sides of a transform, mat X mat^T summed over X's rows (B^T d B and A^T P A in the kernels
    below). ``tmp`` holds mat @ row. The loops are unrolled at compile time, so acc, row and tmp stay in
    registers; mat @ row takes ``mat`` as constants, mat[:, i] (i not a constant) comes from constant memory."""
    n_out, n_in = mat.shape
    entries = tuple(tuple(float(v) for v in row) for row in mat)
    columns_host = np.ascontiguousarray(mat.T, dtype=np.float32)

    @cuda.jit(device=True, fastmath=True)
    def add_row(acc, i, row, tmp):
        columns = cuda.const.array_like(columns_host)
        for q in range(n_out):
            s = float32(0.0)
            for j in range(n_in):
                s += row[j] * float32(entries[q][j])
            tmp[q] = s
        for p in range(n_out):
            for q in range(n_out):
                acc[p, q] += columns[i, p] * tmp[q]

    return add_row


@lru_cache(maxsize=None)
def _input_kernel(m: int, r: int):
    M, AL = m, m + r - 1
    add_row = _add_row(transforms(m, r)[2])

    @cuda.jit(fastmath=True)
    def input_transform(x, v, T, n0, t0, trows, tiles_w, pad_t, pad_w):
        # v[xi * AL + nu, c, t] = (B^T d B)[xi, nu] for the patch d of tile t < T, channel c.
        # Consecutive threads take consecutive tiles: coalesced stores into v.
        _, C, H, W = x.shape
        row = cuda.local.array(AL, float32)
        rb = cuda.local.array(AL, float32)
        acc = cuda.local.array((AL, AL), float32)
        per_image = trows * tiles_w
        for e in range(cuda.grid(1), C * T, cuda.gridsize(1)):
            c = e // T
            t = e - c * T
            n, oh0, ow0 = _tile_origin(t, per_image, tiles_w, M, t0)
            ih0 = oh0 - pad_t
            iw0 = ow0 - pad_w
            for p in range(AL):
                for q in range(AL):
                    acc[p, q] = float32(0.0)
            # B^T d B summed over the patch's rows i, B^T[:, i] (d[i, :] B), so acc stays in registers.
            for i in range(AL):
                ih = ih0 + i
                for j in range(AL):
                    iw = iw0 + j
                    val = float32(0.0)
                    if ih >= 0 and ih < H and iw >= 0 and iw < W:
                        val = x[n0 + n, c, ih, iw]
                    row[j] = val
                add_row(acc, i, row, rb)
            for p in range(AL):
                for q in range(AL):
                    v[p * AL + q, c, t] = acc[p, q]

    return input_transform


MAX_ROWS = 64                 # rows of tiles per block of the output transform, at most


@lru_cache(maxsize=None)
def _output_kernel(m: int, r: int):
    M, AL = m, m + r - 1
    add_row = _add_row(transforms(m, r)[0])

    @cuda.jit(fastmath=True)
    def output_transform(prod, T, bias, flat, K, Ho, Wo, n0, t0, trows, tiles_w, oh_end, relu, G):
        # Block (x, k): rows of tiles x*G .. x*G + G - 1 of output channel k, numbered across the chunk's images.
        # Each thread makes one tile, A^T prod[:, k, t] A + bias[k] (then ReLU), summed over the rows q of
        # prod's alpha x alpha tile as the input transform sums over its patch's rows, into ``stage``: the
        # block's G * m output rows of Wo, back to back. Then the block copies them to ``flat``, the output
        # (N, K, Ho, Wo) as one vector, in long runs: stored from registers, each m x m tile would write m
        # short pieces of m floats, partial writes that keep L2 busy.
        stage = cuda.shared.array(0, float32)
        start = cuda.shared.array(MAX_ROWS, int64)      # where each row of tiles begins in flat
        size = cuda.shared.array(MAX_ROWS, int64)       # and how many of its values are outputs
        row = cuda.local.array(AL, float32)
        ra = cuda.local.array(M, float32)
        acc = cuda.local.array((M, M), float32)
        k, tid = cuda.blockIdx.y, cuda.threadIdx.x
        tr0 = cuda.blockIdx.x * G
        g = tid // tiles_w
        tx = tid - g * tiles_w
        t = (tr0 + g) * tiles_w + tx
        MWo = M * Wo
        if g < G and t < T:
            b = bias[k]
            for i in range(M):
                for j in range(M):
                    acc[i, j] = b
            for q in range(AL):
                for l in range(AL):
                    row[l] = prod[q * AL + l, k, t]
                add_row(acc, q, row, ra)
            for i in range(M):
                for j in range(M):
                    ow = tx * M + j
                    if ow < Wo:
                        val = acc[i, j]
                        if relu and val < float32(0.0):
                            val = float32(0.0)
                        stage[g * MWo + i * Wo + ow] = val
            if tx == 0:
                n, oh0, _ = _tile_origin(t, trows * tiles_w, tiles_w, M, t0)
                start[g] = ((n0 + n) * K + k) * Ho * Wo + oh0 * Wo
                size[g] = min(M, oh_end - oh0) * Wo
        elif g < G and tx == 0:
            size[g] = 0                                 # past the chunk's last row of tiles
        cuda.syncthreads()
        # Value e = g * MWo + rest of the stage, e = tid, tid + blockDim, ...: (g, rest) stepped, not divided.
        g = tid // MWo
        rest = tid - g * MWo
        while g < G:
            if rest < size[g]:
                flat[start[g] + rest] = stage[g * MWo + rest]
            rest += cuda.blockDim.x
            while rest >= MWo:
                rest -= MWo
                g += 1

    return output_transform


def _output_shape(tiles_w: int, m: int, wo: int) -> tuple[int, int, int]:
    """(rows of tiles G, threads, bytes of shared memory) per block of the output transform: whole rows of
    tiles, about 256 threads in whole warps (on the simulator, where each thread is a Python thread, about 8)."""
    want = 8 if backend.is_simulator() else 256
    g = max(1, min(MAX_ROWS, want // tiles_w))
    threads = g * tiles_w if backend.is_simulator() else -(-g * tiles_w // 32) * 32
    shared = 4 * g * m * wo
    if threads > 1024 or shared > 48 << 10:
        raise ValueError(f"Winograd output rows of {wo} values ({tiles_w} tiles) do not fit one block (1024 threads, "
                         "48 KiB of shared memory); use method='gemm' for so wide a layer")
    return g, threads, shared


_FLAT: dict[int, object] = {}    # id(out) -> out as one vector, dropped when out dies (so an id is never stale)


def _flat(out):
    """``out`` as one vector. Made once per array and kept while the array lives: a view costs the host about
    as much as a launch, and a forward pass calls each layer with the same output array."""
    view = _FLAT.get(id(out))
    if view is None:
        if not out.is_c_contiguous():
            raise ValueError("the Winograd path writes a C-contiguous output array; pass one (np.ascontiguousarray)")
        view = _FLAT[id(out)] = out.reshape(out.size)
        weakref.finalize(out, _FLAT.pop, id(out), None)
    return view


def conv_rows_winograd(x, u, bias, out, r: int, pad_top: int, pad_w: int, oh_begin: int, oh_end: int,
                       relu: bool = False, stream=0, workspace: Workspace | None = None) -> None:
    """Output rows [oh_begin, oh_end) of ``out`` (N, K, Ho, Wo) from the band ``x``, stride 1, in tiles of
    m x m outputs from row ``oh_begin``; ``u``: :func:`filter_transform` of the weights on the device,
    (alpha^2, K, C), whose alpha gives m = alpha - r + 1."""
    if oh_end <= oh_begin:
        return
    n, c = x.shape[0], x.shape[1]
    al2, k, _ = u.shape
    m = math.isqrt(al2) - r + 1
    wo = out.shape[3]
    tiles_h, tiles_w = -(-(oh_end - oh_begin) // m), -(-wo // m)
    ws = workspace or WORKSPACE
    into, back = _input_kernel(m, r), _output_kernel(m, r)
    bn = warp.config_for(c).bn
    flat = _flat(out)                         # the output transform writes whole rows as one vector
    g, threads_out, shared = _output_shape(tiles_w, m, wo)     # checked before any kernel runs
    # A tile's buffers: alpha^2 (C + K) floats.
    for n0, nb, r0, trows in chunks(n, tiles_h, tiles_w, 4 * al2 * (c + k), max_bytes()):
        t0 = oh_begin + r0 * m
        tiles = nb * trows * tiles_w
        # Columns padded to whole block tiles: the products take the warp kernel without edge tests (the padding
        # is computed on whatever the buffer holds and never read back).
        cols = -(-tiles // bn) * bn
        v = ws.array("wino-in", (al2, c, cols))
        prod = ws.array("wino-prod", (al2, k, cols))
        blocks, threads = launch_1d(c * tiles)
        into[blocks, threads, stream](x, v, tiles, n0, t0, trows, tiles_w, pad_top, pad_w)
        warp.launch(u, v, prod, stream=stream)
        back[(-(-nb * trows // g), k), threads_out, stream, shared](
            prod, tiles, bias, flat, *out.shape[1:], n0, t0, trows, tiles_w, oh_end, bool(relu), g)

