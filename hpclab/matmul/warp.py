"""4 · Warp tiling: the register-blocked kernel with its threads grouped the way the hardware runs them.

A block's BM x BN tile of C (as in :mod:`.fast`) is split into one WM x WN tile per warp, whose 32 lanes
form an LM x LN grid; each lane owns MI x NI sub-tiles of 4 x 4 outputs, LM * 4 rows and LN * 4 columns
apart, so at every step of k a warp reads few distinct shared words (mostly broadcasts), four per 16-byte
load. Also unlike ``fast``:

- Any M, N, K (float32), either operand read transposed in place (``trans_a``: a stored K x M; the MLP's
  backward products). Where C's sizes do not divide the tiles, the last row and column of
  blocks are shifted back to end at C's edge (their tiles overlap their neighbours', whose outputs they compute
  again, bit for bit the same), so every block runs the loop of whole tiles; only C smaller than a tile (or B's
  rows in runs that the shift would split) takes the build that tests each load's bounds. A K that does not
  divide the tiles costs one test a tile of k.
- B's tile is copied four columns at a time, one 16-byte global load and shared store (:mod:`.wide`), where
  B's rows start on 16-byte boundaries; else value by value, each of a warp's loads on adjacent words. A's,
  stored transposed, value by value (benchmarks/HISTORY.md says why). An operand stored transposed is copied
  along its stored rows, as the other operand is (coalesced either way).
- A step's products in serpentine order (every other row backwards), so consecutive FFMAs share an operand.

``warp_kernel(WarpConfig)`` builds it. ``launch`` picks the tile shape and, for a product whose tiles of C are
too few to fill the GPU, splits K into slices (:mod:`.split_k`); on 3-d arrays it multiplies a batch of
matrices in one launch, one per blockIdx.z (:mod:`hpclab.halo.conv_winograd`'s products), through
:mod:`hpclab.quick_launch`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hpclab import backend
from hpclab.backend import cuda as _cuda
from hpclab.matmul import split_k
from hpclab.matmul.wide import aligned, load4, store4
from hpclab.quick_launch import Launches

cuda = _cuda()  # decides GPU or simulator before numba reads its configuration

from numba import float32, uint64  # noqa: E402 - after the backend choice


@dataclass(frozen=True)
class WarpConfig:
    """bm x bn block tile, bk deep; wm x wn warp tile; mi x ni 4 x 4 sub-tiles per lane."""

    bm: int = 128
    bn: int = 128
    bk: int = 16
    wm: int = 32
    wn: int = 64
    mi: int = 2
    ni: int = 2
    pad: int = 4          # extra words per shared row, against bank conflicts (keeps 16-byte runs aligned)

    @property
    def lanes(self) -> tuple[int, int]:
        """The warp's lanes as an LM x LN grid."""
        return self.wm // (4 * self.mi), self.wn // (4 * self.ni)

    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * 32

    def label(self) -> str:
        lm, ln = self.lanes
        return (f"{self.bm}x{self.bn}x{self.bk} warp {self.wm}x{self.wn} lanes {lm}x{ln} "
                f"thread {4 * self.mi}x{4 * self.ni}" + (f" pad {self.pad}" if self.pad != 4 else ""))

    def blocks_per_sm(self, split: bool = False) -> int:
        """The blocks an SM is asked to hold (the kernel's launch bounds): 512 threads, 128 registers each; but
        three of 128 threads for a split kernel, whose range of k would not fit 128 registers (measured: 240-280
        bytes a thread spilled to local memory at four)."""
        per = max(1, 512 // self.threads)
        return 3 if split and per == 4 else per

    def problems(self, trans_a: bool = False, trans_b: bool = False) -> list[str]:
        """Why this configuration cannot be built (empty when it can), with operands read transposed or not."""
        lm, ln = self.lanes
        if self.wm % (4 * self.mi) or self.wn % (4 * self.ni) or lm * ln != 32:
            return ["a warp tile must hold 32 lanes of mi x ni 4 x 4 sub-tiles"]
        if self.bm % self.wm or self.bn % self.wn:
            return ["the block tile must be a whole number of warp tiles"]
        nt = self.threads
        out = []
        if nt > 1024:
            out.append(f"{nt} threads per block is more than 1024")
        if nt % self.bk or self.bm % (nt // self.bk):
            out.append("the A tile (bm x bk) must split into whole rows of threads")
        if any(nt % (self.bn // unit) or self.bk % (nt // (self.bn // unit)) for unit in (4, 1)):
            out.append("the B tile (bk x bn), in runs of 4 or value by value, must split into whole rows of threads")
        # a transposed operand is copied along its stored rows: whole rows of the tile's m (n) per copying pass
        if trans_a and (nt % self.bm or self.bk % (nt // self.bm)):
            out.append("with a transposed A the threads must be a whole number of bm-wide rows dividing bk")
        if trans_b and (nt % self.bk or self.bn % (nt // self.bk)):
            out.append("with a transposed B the threads must split into whole columns of bk")
        if self.bk not in (4, 8, 12, 16):
            out.append("bk must be 4, 8, 12 or 16 (the kernel writes out a tile's steps of k, four at a time)")
        return out


# 128 x 128 blocks of 8 warps of 32 x 64 outputs, 8 x 8 per lane on a GPU; on the simulator, where each
# thread is a Python thread, 32 x 32 blocks of 2 warps, 4 x 4 per lane.
CONFIG = WarpConfig() if backend.name() == "gpu" else WarpConfig(32, 32, 8, 16, 32, 1, 1, pad=4)
# For a shallow product (K below SHALLOW_K) half-width blocks of four warps, four per SM: each block's
# fixed costs (the first tile's loads, the stores of C) are then hidden by three others rather than one.
SHALLOW = WarpConfig(128, 64, 16, 32, 64, 2, 2) if backend.name() == "gpu" else CONFIG
SHALLOW_K = 1024
# Blocks of 64 x 128 (four warps): for an output of 64 rows a 128-row tile would compute half zeros, and :func:`plan`
# takes them where its model finds the shapes of four warps alike.
SHORT = WarpConfig(64, 128, 16, 32, 64, 2, 2) if backend.name() == "gpu" else CONFIG
# For a narrow C (fewer than 64 columns, or rows), untransposed: blocks of 256 x 32 (four warps of 64 x 32) and of
# 32 x 128 (four warps of 32 x 32, 4 x 8 per lane), where a 64-wide tile computes 64 columns (rows) for as few as 8
# (on an H200, 14328 x 14 x 13600: 78 % of cuBLAS against 66 % in 128 x 64 tiles; 30 x 12900 x 3776: 128 % against
# 85 % in 64 x 128 tiles; runs random-1 and random-before-1 in benchmarks/results/h200_matmul.csv).
THIN = WarpConfig(256, 32, 16, 64, 32, 2, 2) if backend.name() == "gpu" else CONFIG
FLAT = WarpConfig(32, 128, 16, 32, 32, 1, 2) if backend.name() == "gpu" else CONFIG


def config_for(k: int, transposed: bool = False) -> WarpConfig:
    """The tile shape a batched product over k terms uses (and a 2-d one's first candidate); with an operand read
    transposed, 64 x 128 rather than 128 x 64 blocks for a shallow product (a transposed A's 128-row tile would take
    16 copying passes of 128 threads; measured 5-14 % faster at 3000 x 5000 x 700 and 8191 x 4097 x 1000 in either
    transposed layout on an H200, run transposed-tiles in benchmarks/results/h200_matmul.csv)."""
    return (SHORT if transposed else SHALLOW) if k < SHALLOW_K else CONFIG


@lru_cache(maxsize=4096)
def plan(m: int, n: int, k: int, transposed: bool = False) -> tuple[WarpConfig, int]:
    """(tile shape, slices of K) for a 2-d m x k by k x n product (``transposed``: an operand read transposed):
    :func:`split_k.plan` on this GPU."""
    # config_for's shape where its grid fills the GPU; else the model's choice, where it ties in the measured
    # order: 256-thread blocks for deep products, and 64 x 128 before 128 x 64 (faster on every shape of the
    # H200 sweep that did not have N <= 64)
    ties = [SHORT, CONFIG] if k < SHALLOW_K else [CONFIG, SHORT]
    # a narrow C's tile first (its grid, when it fills the GPU, taken whole) and last among the model's ties
    narrow = [] if transposed else [cfg for cfg, side in ((THIN, n), (FLAT, m)) if side < SHALLOW.bn]
    shapes = (*narrow[:1], config_for(k, transposed), *dict.fromkeys(ties + [SHALLOW] + narrow))
    # where C is smaller than the first shape's tile (every load would be tested: the edges build) but not than
    # another's, only the shapes it fills each way (AlexNet's C1 by GEMM: 96 rows, 64 x 128 tiles shifted)
    fits = tuple(cfg for cfg in shapes if m >= cfg.bm and n >= cfg.bn)
    return split_k.planned(m, n, k, shapes if shapes[0] in fits or not fits else fits)


def warp_kernel(cfg: WarpConfig = CONFIG, edges: bool = False, runs: bool = True, batched: bool = False,
                split: bool = False, shift: bool = False, tail: bool = False, trans_a: bool = False,
                trans_b: bool = False):
    """The float32 kernel for one tile shape: ``edges``, any sizes (every load at C's edge tested); ``shift``, C at
    least a tile in each direction but not a multiple of it (the last blocks shifted back inside); ``tail``, a K
    that ends inside a tile of k; B read in 16-byte ``runs``; ``batched``: c[z] = a[z] @ b[z] for 3-d arrays,
    z = blockIdx.z; ``split``: w[z] = the product over the z-th of w.shape[0] slices of K (2-d a and b, 3-d w);
    ``trans_a`` (``trans_b``): the 2-d a (b) is stored transposed, K x M (N x K), and read so in place."""
    # one build for each kernel however it is asked for (as fast.fast_kernel)
    return _warp_kernel(cfg, *(bool(x) for x in (edges, runs, batched, split, shift, tail, trans_a, trans_b)))


@lru_cache(maxsize=None)
def _warp_kernel(cfg: WarpConfig, edges: bool, runs: bool, batched: bool, split: bool, shift: bool, tail: bool,
                 trans_a: bool, trans_b: bool):
    bad = cfg.problems(trans_a, trans_b)
    if batched and (trans_a or trans_b):
        bad.append("a batched product reads its operands untransposed")
    if trans_b and runs:
        bad.append("a transposed B is read value by value, not in 16-byte runs")
    if bad:
        raise ValueError(f"warp kernel configuration {cfg.label()} cannot be built: {'; '.join(bad)}")
    TA, TB = trans_a, trans_b
    U = np.uint64   # unsigned indices need no negative-index guard (see fast.py)
    ZERO, ONE, TWO, THREE, FOUR = U(0), U(1), U(2), U(3), U(4)
    BM, BN, BK, WM, WN, NT = (U(x) for x in (cfg.bm, cfg.bn, cfg.bk, cfg.wm, cfg.wn, cfg.threads))
    LN = U(cfg.lanes[1])
    SA, SB = BM + U(cfg.pad), BN + U(cfg.pad)          # shared row lengths (A is stored k-major)
    # Each operand's tile is copied along its stored rows, consecutive threads on consecutive words: A (B^T)
    # along k, A^T (B) along m (n). B's tile in units of 4 values (a 16-byte load) with ``runs``, else of one:
    # thread t copies units t, t + NT, ... of the tile in row-major order, so a warp's loads and shared stores
    # are of adjacent units (four 4-byte loads of a run each were 16 bytes apart across the warp: four times the
    # memory transactions)
    B_UNIT = 4 if runs else 1
    B_ROW = BN // U(B_UNIT)                            # units in a row of B's tile
    # One copying pass of all threads covers A_DR rows and A_DK steps of k of A's tile (one of them zero), and
    # B_DK steps of k and B_DC columns of B's.
    A_DR, A_DK = (ZERO, NT // BM) if TA else (NT // BK, ZERO)
    B_DK, B_DC = (ZERO, NT // BK) if TB else (NT // B_ROW, ZERO)
    A_N, B_N = cfg.bm * cfg.bk // cfg.threads, cfg.bk * cfg.bn // B_UNIT // cfg.threads  # values, units per thread
    B_HELD = B_UNIT * B_N
    MI, NI, TM, TN = cfg.mi, cfg.ni, 4 * cfg.mi, 4 * cfg.ni
    A_SUB, B_SUB = U(4 * cfg.lanes[0]), U(4 * cfg.lanes[1])    # sub-tiles of one lane, this far apart
    A_SHARED, B_SHARED = 2 * cfg.bk * (cfg.bm + cfg.pad), 2 * cfg.bk * (cfg.bn + cfg.pad)  # plain ints: array sizes
    # Unsigned too: Numba types uint64 * int as int64, and a signed shared index gets a negative-index test
    # (16 x 8 outputs per lane: 256 compares and selects, scalar shared loads instead of 16-byte ones).
    A_BUF, B_BUF = U(A_SHARED // 2), U(B_SHARED // 2)
    EDGES, RUNS, SHIFT, TAIL = edges, runs, shift, tail or edges
    # An edge tile's whole runs of B in 16-byte loads too; not in blocks of 128 threads, whose 128 registers
    # it would overflow into local memory (measured: 240-280 bytes a thread)
    WIDE_EDGE = RUNS and cfg.threads >= 256

    @cuda.jit(device=True, fastmath=True)
    def multiply_step(As, Bs, a_at, b_at, a_frag, b_frag, acc):
        """One step of k: this lane's MI runs of 4 A values, NI runs of 4 B values, TM x TN products."""
        for s in range(MI):
            for i in range(4):
                a_frag[4 * s + i] = As[a_at + U(s) * A_SUB + U(i)]
        for s in range(NI):
            for j in range(4):
                b_frag[4 * s + j] = Bs[b_at + U(s) * B_SUB + U(j)]
        # Row by row, every other row backwards (serpentine): the B value that ends a row starts the next,
        # so more FFMAs take an operand from the reuse cache and fewer wait to be dispatched. Each output
        # sums the same products in the same order: bit for bit the same C.
        for i in range(TM):
            for jj in range(TN):
                j = jj if i % 2 == 0 else TN - 1 - jj
                acc[i, j] += a_frag[i] * b_frag[j]

    @cuda.jit(device=True, fastmath=True)
    def multiply_four(As, Bs, a_at, b_at, a_frag, b_frag, acc):
        """Four steps of k, their shared-memory offsets constants added to one address."""
        multiply_step(As, Bs, a_at, b_at, a_frag, b_frag, acc)
        multiply_step(As, Bs, a_at + SA, b_at + SB, a_frag, b_frag, acc)
        multiply_step(As, Bs, a_at + TWO * SA, b_at + TWO * SB, a_frag, b_frag, acc)
        multiply_step(As, Bs, a_at + THREE * SA, b_at + THREE * SB, a_frag, b_frag, acc)

    @cuda.jit(device=True)
    def fetch_edge(a, b, k0, K, M, N, row0, col0, a_r, a_k, b_k, b_c, a_next, b_next):
        """A tile at an edge: global -> registers, zeros past k = K (and, in the ``edges`` build, outside a and b;
        without it the tile's rows and columns lie inside, and those tests vanish when Numba compiles)."""
        for s in range(A_N):
            r, kk = row0 + a_r + U(s) * A_DR, k0 + a_k + U(s) * A_DK
            a_next[s] = (a[kk, r] if TA else a[r, kk]) if (not EDGES or r < M) and kk < K else float32(0)
        for s in range(B_N):
            kk, cc = k0 + b_k + U(s) * B_DK, col0 + b_c + U(s) * B_DC
            if WIDE_EDGE and kk < K and (not EDGES or cc + THREE < N):    # a whole run: still one 16-byte load
                b_next[4 * s], b_next[4 * s + 1], b_next[4 * s + 2], b_next[4 * s + 3] = load4(b, kk, cc)
            else:
                for j in range(B_UNIT):
                    b_next[B_UNIT * s + j] = ((b[cc, kk] if TB else b[kk, cc + U(j)])
                                              if kk < K and (not EDGES or cc + U(j) < N) else float32(0))

    # The edge tests and the shift take registers, and blocks of fewer than 256 threads are meant to share an SM:
    # ask for cfg.blocks_per_sm() blocks per SM still (512 threads of 128 registers; three for a split kernel).
    small = cfg.threads < 256
    bounds = ({"launch_bounds": (cfg.threads, cfg.blocks_per_sm(split))}
              if (TAIL or SHIFT or small) and backend.name() == "gpu" else {})

    @cuda.jit(device=True, fastmath=True)
    def block_tile(a, b, c, k_lo, K):
        """This block's tile of c = op(a)[:, k_lo:K] @ op(b)[k_lo:K] (2-d arrays; k_lo a multiple of BK)."""
        M, N = uint64(c.shape[0]), uint64(c.shape[1])
        tid = uint64(cuda.threadIdx.x)
        row0, col0 = uint64(cuda.blockIdx.y) * BM, uint64(cuda.blockIdx.x) * BN
        if SHIFT:         # the last tiles end at C's edge (M >= BM, N >= BN: kernel_for's test)
            row0, col0 = min(row0, M - BM), min(col0, N - BN)
        warp, lane = tid // U(32), tid % U(32)
        # This lane's first row and column inside the block tile.
        m0 = (warp // (BN // WN)) * WM + (lane // LN) * FOUR
        n0 = (warp % (BN // WN)) * WN + (lane % LN) * FOUR
        # what this thread copies first (coalesced along the stored rows); pass s adds s * (A_DR, A_DK), ...
        a_r, a_k = (tid % BM, tid // BM) if TA else (tid // BK, tid % BK)
        b_c, b_k = (tid // BK, tid % BK) if TB else ((tid % B_ROW) * U(B_UNIT), tid // B_ROW)
        As = cuda.shared.array(A_SHARED, float32, alignment=16)   # As[buf, k, m] = A[row0 + m, k0 + k]
        Bs = cuda.shared.array(B_SHARED, float32, alignment=16)   # Bs[buf, k, n] = B[k0 + k, col0 + n]
        acc = cuda.local.array((TM, TN), float32)
        a_frag = cuda.local.array(TM, float32)
        b_frag = cuda.local.array(TN, float32)
        a_next = cuda.local.array(A_N, float32)
        b_next = cuda.local.array(B_HELD, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0
        # Without ``edges`` every block's tile lies inside C, and without ``tail`` every tile of k is whole:
        # these tests vanish when Numba compiles.
        outside = EDGES and not (row0 + BM <= M and col0 + BN <= N)
        tiles = (K - k_lo + BK - ONE) // BK
        for t in range(ZERO, tiles + ONE):
            cur, nxt, more, k0 = t % U(2), ONE - t % U(2), t < tiles, k_lo + t * BK
            if more and TAIL and (outside or k0 + BK > K):
                fetch_edge(a, b, k0, K, M, N, row0, col0, a_r, a_k, b_k, b_c, a_next, b_next)
            elif more:        # tile t: global -> registers; the loads are in flight during the products
                for s in range(A_N):
                    r, kk = row0 + a_r + U(s) * A_DR, k0 + a_k + U(s) * A_DK
                    a_next[s] = a[kk, r] if TA else a[r, kk]
                for s in range(B_N):
                    k_b, cc = k0 + b_k + U(s) * B_DK, col0 + b_c + U(s) * B_DC
                    if RUNS:
                        b_next[4 * s], b_next[4 * s + 1], b_next[4 * s + 2], b_next[4 * s + 3] = load4(b, k_b, cc)
                    else:
                        b_next[s] = b[cc, k_b] if TB else b[k_b, cc]
            if t > ZERO:      # tile t - 1 is in shared buffer `cur`: multiply it
                a_base, b_base = cur * A_BUF + m0, cur * B_BUF + n0
                # The tile's steps of k written out, four at a time (BK is a constant: the
                # conditions vanish when Numba compiles), so that the compiler loads the next
                # steps' fragments while the current products run (a loop waited for its loads).
                multiply_four(As, Bs, a_base, b_base, a_frag, b_frag, acc)
                if BK > FOUR:
                    multiply_four(As, Bs, a_base + FOUR * SA, b_base + FOUR * SB, a_frag, b_frag, acc)
                if BK > U(8):
                    multiply_four(As, Bs, a_base + U(8) * SA, b_base + U(8) * SB, a_frag, b_frag, acc)
                if BK > U(12):
                    multiply_four(As, Bs, a_base + U(12) * SA, b_base + U(12) * SB, a_frag, b_frag, acc)
            if more:          # registers -> the other buffer (last read before the previous barrier)
                for s in range(A_N):
                    As[nxt * A_BUF + (a_k + U(s) * A_DK) * SA + a_r + U(s) * A_DR] = a_next[s]
                for s in range(B_N):
                    at = nxt * B_BUF + (b_k + U(s) * B_DK) * SB + b_c + U(s) * B_DC
                    if RUNS:
                        store4(Bs, at, b_next[4 * s], b_next[4 * s + 1], b_next[4 * s + 2], b_next[4 * s + 3])
                    else:
                        Bs[at] = b_next[s]
            cuda.syncthreads()
        for s in range(MI):
            for i in range(4):
                for q in range(NI):
                    for j in range(4):
                        r, cc = row0 + m0 + U(s) * A_SUB + U(i), col0 + n0 + U(q) * B_SUB + U(j)
                        if not EDGES or (r < M and cc < N):
                            c[r, cc] = acc[4 * s + i, 4 * q + j]

    if split:
        @cuda.jit(fastmath=True, **bounds)
        def warp_tiled_split(a, b, w):
            # whole tiles of k per slice, as split_k.slices counts them
            z, K, S = uint64(cuda.blockIdx.z), uint64(a.shape[0] if TA else a.shape[1]), uint64(w.shape[0])
            depth = ((K + BK - ONE) // BK + S - ONE) // S * BK
            k0 = min(K, z * depth)
            block_tile(a, b, w[z], k0, min(K, k0 + depth))
        return warp_tiled_split

    if batched:
        @cuda.jit(fastmath=True, **bounds)
        def warp_tiled_batched(a, b, c):
            z = cuda.blockIdx.z
            block_tile(a[z], b[z], c[z], ZERO, uint64(a.shape[2]))
        return warp_tiled_batched

    @cuda.jit(fastmath=True, **bounds)
    def warp_tiled(a, b, c):
        block_tile(a, b, c, ZERO, uint64(a.shape[0] if TA else a.shape[1]))
    return warp_tiled


def kernel_for(a, b, c, cfg: WarpConfig = CONFIG, split: bool = False, trans_a: bool = False,
               trans_b: bool = False):
    """The kernel ``launch`` runs: B in 16-byte runs if it can; C's sizes that do not divide the tiles by shifted
    tiles, or where C is smaller than a tile (or a shifted column of runs would not start a run) by tested loads;
    a K that does not divide them by a tested last tile (3-d c: the batched kernel, or with ``split`` the slices'
    partial sums)."""
    (m, n), k = tuple(c.shape)[-2:], tuple(a.shape)[-2 if trans_a else -1]  # (the simulator takes no negative index)
    runs = not trans_b and aligned(b)
    ragged = bool(m % cfg.bm or n % cfg.bn)
    edges = ragged and (m < cfg.bm or n < cfg.bn or (runs and n % 4 > 0))
    return warp_kernel(cfg, edges, runs, len(c.shape) == 3 and not split, split, shift=ragged and not edges,
                       tail=bool(k % cfg.bk) and not edges,     # (the edges build tests k too: one build, not two)
                       trans_a=trans_a, trans_b=trans_b)


def _choose(a, b, c, variant: tuple[WarpConfig, bool, bool, int]):
    """(kernel, grid, threads) of c = op(a) @ op(b) (a batch: 3-d; slices of K: c the 3-d workspace) in
    ``variant``'s (tile shape, trans_a, trans_b, slices)."""
    cfg, trans_a, trans_b, split = variant
    shape = tuple(c.shape)
    grid = (-(-shape[-1] // cfg.bn), -(-shape[-2] // cfg.bm)) + shape[:-2]
    return kernel_for(a, b, c, cfg, split > 1, trans_a, trans_b), grid, cfg.threads


_launches = Launches(_choose)


def launch(a, b, c, cfg: WarpConfig | None = None, stream=0, split: int | None = None,
           trans_a: bool = False, trans_b: bool = False) -> None:
    """c = op(a) @ op(b) on float32 device arrays of any sizes (no checks), op(a) = a.T with ``trans_a`` (a stored
    K x M; likewise b); 3-d arrays: c[z] = a[z] @ b[z] for every z. A 2-d product's tile shape and slices of K are
    :func:`plan`'s unless given (``split``: at most that many)."""
    (m, n), k = tuple(c.shape)[-2:], tuple(a.shape)[-2 if trans_a else -1]
    if len(c.shape) == 3:
        cfg, split = cfg or config_for(k), 1
    elif split is None:
        cfg, split = split_k.planned(m, n, k, (cfg,)) if cfg else plan(m, n, k, bool(trans_a or trans_b))
    else:
        cfg = cfg or config_for(k, bool(trans_a or trans_b))
        split = split_k.slices(k, cfg.bk, split)[0]
    split_k.launch(_launches, a, b, c, (cfg, bool(trans_a), bool(trans_b), split), stream)
