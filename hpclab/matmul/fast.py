"""3 · Register blocking, and the entry point programs and training multiply through.

Each thread accumulates a TM x TN micro-tile of the block's BM x BN tile of C in registers, reading
TM + TN shared values for TM * TN fused multiply-adds. A's tiles are stored transposed (k-major) so
both operands are read along rows; shared tiles are padded against bank conflicts and double-buffered,
the next tile prefetched into registers while the current one is used. float16 inputs are multiplied
and accumulated in float32; ``trans_a`` reads ``a.T`` in place (a dense layer's backward pass). A
float32 product whose grid would not fill the GPU is split along K as :mod:`.split_k` plans it
(:func:`split_for`).

``matmul(a, b, kernel=...)`` runs any of the four kernels on NumPy arrays (returns NumPy) or device
arrays (returns a device array); naive and tiled read a transposed operand through ``x.T``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hpclab import backend
from hpclab.backend import cuda as _cuda

cuda = _cuda()  # decides GPU or simulator before numba reads its configuration

import numba  # noqa: E402 - after the backend choice (numba reads NUMBA_ENABLE_CUDASIM on import)

from hpclab.matmul import naive, split_k, tiled, warp  # noqa: E402
from hpclab.quick_launch import Launches  # noqa: E402

KERNELS = ("naive", "tiled", "fast")  # any shape and dtype: what programs and training choose from
LADDER = KERNELS + ("warp",)           # and the warp-tiled rung: float32
HALF = np.dtype(np.float16)       # accepted as input by the fast kernel: accumulated in float32


@dataclass(frozen=True)
class FastConfig:
    """Tile shape of the register-blocked kernel: bm x bn, the block's tile of C; bk, the depth of one shared-memory
    step; tm x tn, each thread's micro-tile (bm/tm * bn/tn threads); vec, a thread's rows and columns come in runs of
    ``vec`` adjacent elements, ``vec * threads`` apart (4: a run is one 16-byte shared load; 1: neighbouring threads
    read neighbouring words); pad, extra elements per shared-memory row, against bank conflicts."""

    bm: int = 128
    bn: int = 128
    bk: int = 8
    tm: int = 8
    tn: int = 8
    vec: int = 4
    pad: int = 4

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def blocks_per_sm(self, split: bool = False) -> int:
        """The blocks an SM holds at a time, for :mod:`.split_k`'s model: 512 threads (up to 128 registers each)."""
        return max(1, 512 // self.threads)

    def label(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk} / {self.tm}x{self.tn} vec{self.vec} pad{self.pad}"

    def problems(self, trans_a: bool = False) -> list[str]:
        """Why this configuration cannot be built (empty when it can)."""
        out = []
        if self.bm % self.tm or self.bn % self.tn:
            out.append("bm must be a multiple of tm and bn of tn")
        elif self.tm % self.vec or self.tn % self.vec:
            out.append("tm and tn must be multiples of vec")
        else:
            nt = self.threads
            if nt > 1024:
                out.append(f"{nt} threads per block is more than 1024")
            if nt % self.bk or (self.bm * self.bk) % nt:
                out.append("the A tile (bm x bk) must split evenly over the threads, whole rows per step")
            if nt % self.bn or (self.bk * self.bn) % nt:
                out.append("the B tile (bk x bn) must split evenly over the threads, whole rows per step")
            # A transposed operand is copied along its stored rows: whole tile columns per step.
            if trans_a and nt % self.bm:
                out.append("with a transposed A the threads must be a multiple of bm")
        return out


# The fast kernel's default tile shapes: change here to retune.
FAST_CONFIG = {
    np.dtype(np.float32): FastConfig(128, 128, 8, 8, 8, vec=4, pad=4),
    np.dtype(np.float64): FastConfig(64, 64, 8, 4, 4, vec=4, pad=4),
}
# On the simulator every CUDA thread is a Python thread: small blocks.
SIM_FAST_CONFIG = FastConfig(16, 16, 4, 4, 4, vec=2, pad=1)


def acc_dtype(dtype) -> np.dtype:
    """The dtype the kernels accumulate (and by default return) ``dtype`` products in."""
    return np.dtype(np.float32) if np.dtype(dtype) == HALF else np.dtype(dtype)


def fast_kernel(dtype, config: FastConfig, trans_a: bool = False, trans_b: bool = False, split: int = 1):
    """The register-blocked kernel for one input dtype, tile shape and pair of transposes (compiled
    on first launch). ``split`` > 1 (split-K): its third argument is a split x M x N workspace, and block z
    (``blockIdx.z``) writes the partial sums over the z-th of ``split`` slices of K into layer z."""
    # one build for each kernel however it is asked for (defaults given or not): the launch's, the GEMM
    # convolution's and the one whose resources the bench reads are then the same compiled kernel
    return _fast_kernel(np.dtype(dtype), config, bool(trans_a), bool(trans_b), int(split))


@lru_cache(maxsize=None)
def _fast_kernel(dtype, config: FastConfig, trans_a: bool, trans_b: bool, split: int):
    bad = config.problems(trans_a)
    if bad:
        raise ValueError(f"fast kernel configuration {config.label()} cannot be built: {'; '.join(bad)}")
    nbt = numba.from_dtype(acc_dtype(dtype))       # what products accumulate in
    # Widens a loaded element to nbt (a no-op for float32/float64 inputs); on the simulator, where a
    # kernel is plain Python, NumPy's scalar type does the same far more cheaply.
    conv = np.dtype(str(nbt)).type if backend.is_simulator() else nbt
    u = numba.uint64
    # Index arithmetic is unsigned 64-bit throughout: Numba guards every signed index against
    # negative values (Python's a[-1]); unsigned ones need no guard, so the compiler can fold the
    # constant part of each shared-memory index into the load instruction. Constants are uint64
    # too: Numba types uint64 * int as a signed int64, and the guard is back.
    C = np.uint64
    ZERO, ONE, TWO = C(0), C(1), C(2)
    SPLIT = C(split)
    BM, BN, BK, TM, TN, V = (C(x) for x in (config.bm, config.bn, config.bk, config.tm, config.tn,
                                               config.vec))
    TX = BN // TN                  # threads along a row of the C tile
    TY = BM // TM
    NT = TX * TY
    SA = BM + C(config.pad)        # shared row lengths, padded against bank conflicts
    SB = BN + C(config.pad)
    A_BUF = BK * SA                # one buffer of the transposed A tile
    B_BUF = BK * SB
    A_STEPS = BM * BK // NT        # A elements each thread copies per tile
    B_STEPS = BK * BN // NT
    # Consecutive threads copy consecutive elements as stored (coalesced): along k for A, along n
    # for B, the other way round for a transposed operand. One copying step of all threads covers
    # A_DM rows and A_DK depths of the A tile (one of them zero), B_DK x B_DN of B's.
    A_DM, A_DK = (ZERO, NT // BM) if trans_a else (NT // BK, ZERO)
    B_DK, B_DN = (ZERO, NT // BK) if trans_b else (NT // BN, ZERO)
    # A thread's i-th row and j-th column in the tile: runs of V adjacent ones, V * (threads along that side) apart.
    A_OFF = tuple(C((i // config.vec) * (config.bm // config.tm) * config.vec + i % config.vec)
                  for i in range(config.tm))
    B_OFF = tuple(C((j // config.vec) * (config.bn // config.tn) * config.vec + j % config.vec)
                  for j in range(config.tn))
    # Array sizes and unrolled loop counts must be plain compile-time ints.
    ntm, ntn = config.tm, config.tn
    a_shared, b_shared = int(2 * A_BUF), int(2 * B_BUF)
    a_steps, b_steps = int(A_STEPS), int(B_STEPS)
    # 16-byte aligned tiles let the compiler merge adjacent shared loads into one 128-bit load. The
    # body is a device function, inlined into the kernel. (The simulator takes neither option.)
    align = None if backend.is_simulator() else 16
    inline = {} if backend.is_simulator() else {"forceinline": True}

    @cuda.jit(device=True, fastmath=True, **inline)
    def product(a, b, c):
        M = u(c.shape[0])
        N = u(c.shape[1])
        K = u(a.shape[0]) if trans_a else u(a.shape[1])
        tid = u(cuda.threadIdx.x)
        tx = tid % TX
        ty = tid // TX
        row0 = u(cuda.blockIdx.y) * BM
        col0 = u(cuda.blockIdx.x) * BN
        # What this thread copies first (row a_r, depth a_k of A's tile; depth b_k, column b_c of B's);
        # step s adds s * (A_DM, A_DK), s * (B_DK, B_DN).
        if trans_a:
            a_r = tid % BM
            a_k = tid // BM
        else:
            a_k = tid % BK
            a_r = tid // BK
        if trans_b:
            b_k = tid % BK
            b_c = tid // BK
        else:
            b_c = tid % BN
            b_k = tid // BN

        # Two flat shared buffers of each (double buffering): As[buf * A_BUF + k * SA + m] holds
        # A[row0 + m, k0 + k] (transposed), Bs[buf * B_BUF + k * SB + n] holds B[k0 + k, col0 + n].
        As = cuda.shared.array(a_shared, nbt, alignment=align)
        Bs = cuda.shared.array(b_shared, nbt, alignment=align)
        acc = cuda.local.array((ntm, ntn), nbt)
        a_frag = cuda.local.array(ntm, nbt)
        b_frag = cuda.local.array(ntn, nbt)
        a_next = cuda.local.array(a_steps, nbt)
        b_next = cuda.local.array(b_steps, nbt)
        # Loops over compile-time constants are unrolled: these local arrays live in registers.
        for i in range(ntm):
            for j in range(ntn):
                acc[i, j] = nbt(0)

        # This block's tiles of k: all of them, or with split-K its slice (blockIdx.z) of them.
        ntiles = (K + BK - ONE) // BK
        k_first = ZERO
        if SPLIT > ONE:
            per = (ntiles + SPLIT - ONE) // SPLIT
            t_first = min(ntiles, u(cuda.blockIdx.z) * per)
            ntiles = min(ntiles, t_first + per) - t_first
            k_first = t_first * BK

        # Tile 0: global -> registers -> shared buffer 0. Outside the matrix: zeros.
        for s in range(a_steps):
            r = row0 + a_r + u(s) * A_DM
            kk = k_first + a_k + u(s) * A_DK
            a_next[s] = conv(a[kk, r] if trans_a else a[r, kk]) if r < M and kk < K else nbt(0)
        for s in range(b_steps):
            kk = k_first + b_k + u(s) * B_DK
            cc = col0 + b_c + u(s) * B_DN
            b_next[s] = conv(b[cc, kk] if trans_b else b[kk, cc]) if kk < K and cc < N else nbt(0)
        for s in range(a_steps):
            As[(a_k + u(s) * A_DK) * SA + a_r + u(s) * A_DM] = a_next[s]
        for s in range(b_steps):
            Bs[(b_k + u(s) * B_DK) * SB + b_c + u(s) * B_DN] = b_next[s]
        cuda.syncthreads()

        a_thread = ty * V           # this thread's first row/column inside the tile
        b_thread = tx * V
        for t in range(ZERO, ntiles):
            cur = t % TWO
            more = t + ONE < ntiles
            if more:
                # Fetch the next tile now: the loads are in flight while we compute.
                k0 = k_first + (t + ONE) * BK
                for s in range(a_steps):
                    r = row0 + a_r + u(s) * A_DM
                    kk = k0 + a_k + u(s) * A_DK
                    a_next[s] = conv(a[kk, r] if trans_a else a[r, kk]) if r < M and kk < K else nbt(0)
                for s in range(b_steps):
                    kk = k0 + b_k + u(s) * B_DK
                    cc = col0 + b_c + u(s) * B_DN
                    b_next[s] = conv(b[cc, kk] if trans_b else b[kk, cc]) if kk < K and cc < N else nbt(0)
            a_base = cur * A_BUF + a_thread
            b_base = cur * B_BUF + b_thread
            # A while loop, not range(): Numba's range loop carries extra counters, and k * SA keeps
            # the 16-byte alignment visible to the compiler.
            k = ZERO
            while k < BK:
                for i in range(ntm):
                    a_frag[i] = As[a_base + k * SA + A_OFF[i]]
                for j in range(ntn):
                    b_frag[j] = Bs[b_base + k * SB + B_OFF[j]]
                for i in range(ntm):
                    for jj in range(ntn):      # serpentine order, as in warp.py: bit for bit the same C
                        j = jj if i % 2 == 0 else ntn - 1 - jj
                        acc[i, j] += a_frag[i] * b_frag[j]
                k += ONE
            if more:
                # The other buffer was last read before the previous barrier: safe to fill.
                nxt = ONE - cur
                for s in range(a_steps):
                    As[nxt * A_BUF + (a_k + u(s) * A_DK) * SA + a_r + u(s) * A_DM] = a_next[s]
                for s in range(b_steps):
                    Bs[nxt * B_BUF + (b_k + u(s) * B_DK) * SB + b_c + u(s) * B_DN] = b_next[s]
            cuda.syncthreads()

        for i in range(ntm):
            r = row0 + a_thread + A_OFF[i]
            if r < M:
                for j in range(ntn):
                    cc = col0 + b_thread + B_OFF[j]
                    if cc < N:
                        c[r, cc] = acc[i, j]

    if split > 1:
        @cuda.jit(fastmath=True)
        def fast_split(a, b, w):
            product(a, b, w[cuda.blockIdx.z])
        return fast_split

    @cuda.jit(fastmath=True)
    def fast(a, b, c):
        product(a, b, c)

    return fast


def fast_config(dtype) -> FastConfig:
    """The fast kernel's tile shape for ``dtype`` inputs on this backend (float16 takes float32's)."""
    return SIM_FAST_CONFIG if backend.is_simulator() else FAST_CONFIG[acc_dtype(dtype)]


def split_for(m: int, n: int, k: int, cfg: FastConfig, dtype, out_dtype) -> int:
    """How many slices of K the fast kernel splits an m x n x k product into: :mod:`.split_k`'s plan for
    ``cfg``'s tiles on this GPU (1 where the grid fills the GPU; on the simulator, always 1); float32 only (the
    slices' sums go through a float32 workspace, added in a fixed order: the same bits on every run)."""
    if np.dtype(dtype) != np.float32 or np.dtype(out_dtype) != np.float32:
        return 1
    return split_k.planned(m, n, k, (cfg,))[1]


def auto_split(a, c, trans_a: bool = False, cfg: FastConfig | None = None) -> int:
    """:func:`split_for`'s choice for the fast kernel computing c = op(a) @ ...: products computed in row
    slices pass the whole product's choice, so that each slice gives the bits the whole would."""
    cfg = cfg or fast_config(a.dtype)
    return split_for(c.shape[0], c.shape[1], a.shape[0] if trans_a else a.shape[1], cfg, a.dtype, c.dtype)


def plan(kernel: str, a, c, trans_a: bool = False, trans_b: bool = False) -> tuple:
    """(config, slices of K) ``launch`` would choose for c = op(a) @ op(b) by ``kernel`` (None, None for the naive and
    tiled kernels): a product computed in row slices passes the whole product's to each, for its bits."""
    if kernel == "fast":
        cfg = fast_config(a.dtype)
        return cfg, auto_split(a, c, trans_a, cfg)
    if kernel == "warp":     # as warp.launch plans it
        return warp.plan(c.shape[0], c.shape[1], a.shape[0] if trans_a else a.shape[1], bool(trans_a or trans_b))
    return None, None


def _choose_fast(a, b, c, variant):
    """(kernel, grid, threads) of the fast kernel (with split-K, c is the slices' 3-d workspace); ``variant``:
    (config, trans_a, trans_b, slices of K)."""
    cfg, trans_a, trans_b, split = variant
    m, n = tuple(c.shape)[-2:]          # (the simulator's shapes take no negative index)
    grid = (-(-n // cfg.bn), -(-m // cfg.bm)) + ((split,) if split > 1 else ())
    return fast_kernel(np.dtype(a.dtype), cfg, trans_a, trans_b, split=split), grid, cfg.threads


_fast_launches = Launches(_choose_fast)


def launch(kernel: str, a, b, c, config=None,
           trans_a: bool = False, trans_b: bool = False, split: int | None = None) -> None:
    """c (M x N) = op(a) @ op(b) on device arrays, op(a) being a (M x K) or, with trans_a, a.T (a stored
    K x M), likewise b; no checks. ``split`` (fast and warp kernels, float32 in and out; other dtypes are not
    split): at most that many slices of K, None = the kernel's own plan (:func:`split_for`, ``warp.plan``); the
    slices' partial sums are added in order 0, 1, ... (:mod:`.split_k`)."""
    if kernel == "fast":
        cfg = config or fast_config(np.dtype(a.dtype))
        split = auto_split(a, c, trans_a, cfg) if split is None else split
        if np.dtype(a.dtype) != np.float32 or np.dtype(c.dtype) != np.float32:
            split = 1       # the workspace is float32: another dtype's product is not split
        elif split > 1:
            split = split_k.slices(a.shape[0] if trans_a else a.shape[1], cfg.bk, split)[0]
        split_k.launch(_fast_launches, a, b, c, (cfg, bool(trans_a), bool(trans_b), split))
    elif kernel == "warp":
        warp.launch(a, b, c, config if isinstance(config, warp.WarpConfig) else None, split=split,
                    trans_a=trans_a, trans_b=trans_b)
    else:
        {"naive": naive, "tiled": tiled}[kernel].launch(a.T if trans_a else a, b.T if trans_b else b, c)


def _is_device(x) -> bool:
    return hasattr(x, "copy_to_host")


def _describe(x) -> str:
    return f"{'device array' if _is_device(x) else type(x).__name__} of shape {tuple(np.shape(x))}"


def check_operands(a, b, kernel: str = "naive", trans_a: bool = False, trans_b: bool = False):
    """(M, K, N, the inputs' dtype) of op(a) @ op(b); ValueError for a bad shape, dtype or kernel name."""
    if kernel not in LADDER:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(LADDER)}")
    for name, x in (("a", a), ("b", b)):
        if not (_is_device(x) or isinstance(x, np.ndarray)):
            raise ValueError(f"{name} must be a NumPy array or a Numba device array, not {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix; got {x.ndim}-D shape {tuple(x.shape)} "
                             f"(reshape it, e.g. x.reshape(1, -1) for a row vector)")
        if 0 in x.shape:
            raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): matrices need at least one row "
                             f"and one column")
        if np.dtype(x.dtype) not in (np.float32, np.float64, HALF):
            raise ValueError(f"{name} has dtype {np.dtype(x.dtype)}; the kernels support float32 and "
                             f"float64 only, and float16 inputs multiplied in float32 "
                             f"(convert with .astype(np.float32))")
    M, K = (a.shape[1], a.shape[0]) if trans_a else a.shape
    Kb, N = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if K != Kb:
        op_a, op_b = ("a.T" if trans_a else "a"), ("b.T" if trans_b else "b")
        raise ValueError(f"shapes do not match for {op_a} @ {op_b}: a is {_describe(a)}, b is "
                         f"{_describe(b)}; {op_a}'s columns ({K}) must equal {op_b}'s rows ({Kb})")
    if np.dtype(a.dtype) != np.dtype(b.dtype):
        raise ValueError(f"a is {np.dtype(a.dtype)} but b is {np.dtype(b.dtype)}: give both the same "
                         f"dtype (e.g. b.astype(a.dtype))")
    if np.dtype(a.dtype) == HALF and kernel != "fast":
        raise ValueError(f"the {kernel} kernel multiplies float32 or float64; float16 inputs are multiplied "
                         f"in float32 by kernel='fast' (or convert them with .astype(np.float32))")
    if kernel == "warp" and np.dtype(a.dtype) != np.float32:
        raise ValueError(f"the warp kernel multiplies float32 only (got {np.dtype(a.dtype)}); use kernel='fast'")
    return M, K, N, np.dtype(a.dtype)


def matmul(a, b, kernel: str = "naive", out=None, config=None,
           trans_a: bool = False, trans_b: bool = False):
    """C = op(a) @ op(b) with the kernel ``naive``, ``tiled``, ``fast`` or ``warp`` (``config``: a
    :class:`FastConfig` or a ``warp.WarpConfig``); op(a) is a, or a.T with ``trans_a``, likewise b.
    float16 inputs need the fast kernel. NumPy inputs give a NumPy result; a device array among them
    keeps it on the device. ``out`` (M x N, the inputs' dtype, or float32 for float16 inputs; a device
    array, or NumPy for NumPy inputs) receives the result and is returned."""
    M, K, N, dtype = check_operands(a, b, kernel, trans_a, trans_b)
    result = acc_dtype(dtype)
    on_device = _is_device(a) or _is_device(b)
    da = a if _is_device(a) else cuda.to_device(np.ascontiguousarray(a))
    db = b if _is_device(b) else cuda.to_device(np.ascontiguousarray(b))
    if out is not None:
        if tuple(out.shape) != (M, N) or np.dtype(out.dtype) not in {result, dtype}:
            also = " (or float16)" if dtype == HALF else ""
            raise ValueError(f"out must be a {M} x {N} {result}{also} array; got {_describe(out)} of "
                             f"{np.dtype(out.dtype)}")
        if on_device and not _is_device(out):
            raise ValueError("out must be a device array when an input is a device array")
    dc = out if out is not None and _is_device(out) else cuda.device_array((M, N), dtype=result)
    launch(kernel, da, db, dc, config=config, trans_a=trans_a, trans_b=trans_b)
    return dc if on_device or _is_device(out) else dc.copy_to_host(out)


def flops(m: int, k: int, n: int) -> float:
    """Floating-point operations of one m x k by k x n product (a multiply and an add per term)."""
    return 2.0 * m * k * n

