"""Matrix multiply: kernels against NumPy, input errors, the tutorial's program and distributed GEMM."""
from __future__ import annotations

import numpy as np
import pytest

from hpclab import backend
from hpclab.matmul import fast as mm, naive, split_k, tiled, warp
from .helpers import last_json, run_mpi

SIM = backend.is_simulator()


def operands(m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (m, k)).astype(dtype), rng.uniform(-1, 1, (k, n)).astype(dtype)


def assert_product(c, a, b):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.shape == ref.shape and c.dtype == a.dtype
    tol = 8 * np.finfo(a.dtype).eps * max(1.0, np.sqrt(a.shape[1])) * np.abs(ref).max()
    np.testing.assert_allclose(c, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel", mm.KERNELS)
def test_odd_shapes_match_numpy(kernel, dtype):
    a, b = operands(37, 29, 53, dtype)
    assert_product(mm.matmul(a, b, kernel), a, b)


# Tile shapes run on the simulator too: the default GPU one (256 threads,
# 16-byte runs), scalar runs without padding, and a deeper k-tile. The
# shapes leave partial tiles in every direction and span several blocks.
@pytest.mark.parametrize("config, shape", [
    (mm.FAST_CONFIG[np.dtype(np.float32)], (130, 9, 3)),
    (mm.FastConfig(16, 16, 4, 4, 4, vec=1, pad=0), (37, 29, 53)),
    (mm.FastConfig(32, 16, 8, 4, 4, vec=4, pad=4), (40, 17, 20)),
])
def test_fast_configurations(config, shape):
    a, b = operands(*shape, np.float32, seed=1)
    assert_product(mm.matmul(a, b, "fast", config=config), a, b)


# The warp-tiled rung on the simulator's tiles (32 x 32 x 8): several blocks and several tiles of k,
# a second configuration with other warp and lane shapes, and tiles 16 deep (all four written-out
# groups of k steps, as on a GPU). Sizes that divide the tiles take the kernel without edge tests.
# On a GPU also the shallow-K tiles (the simulator's are CONFIG).
WARP_CONFIGS = list(dict.fromkeys([warp.CONFIG, warp.SHALLOW, warp.SHORT, warp.WarpConfig(32, 64, 8, 32, 32, 2, 1),
                                   warp.WarpConfig(32, 32, 16, 16, 32, 1, 1)]))


@pytest.mark.parametrize("config", WARP_CONFIGS)
def test_warp_kernel_matches_numpy(config):
    a, b = operands(2 * config.bm, 3 * config.bk, 3 * config.bn, np.float32, seed=4)
    assert_product(mm.matmul(a, b, "warp", config=config), a, b)


# Any shape: partial tiles of C on the right and at the bottom, a partial last tile of k, rows of B
# that do not start on 16-byte boundaries (N not a multiple of 4: 4-byte loads), and the
# small analogues of N = 4095 (one less than the tiles) and of 3000 x 5000 x 700.
@pytest.mark.parametrize("config", WARP_CONFIGS)
@pytest.mark.parametrize("m, k, n", [(33, 17, 65), (1, 1, 1), (31, 7, 95), (37, 43, 41), (63, 31, 63),
                                     (30, 7, 52), (64, 24, 100)])
def test_warp_kernel_takes_any_shape(config, m, k, n):
    a, b = operands(m, k, n, np.float32, seed=m + k + n)
    assert_product(mm.matmul(a, b, "warp", config=config), a, b)


@pytest.mark.parametrize("z, m, k, n", [(3, 33, 17, 65), (2, 64, 24, 96)])
def test_batched_warp_kernel_multiplies_every_matrix(z, m, k, n):
    """One launch, blockIdx.z picks the matrix: odd sizes take the edge tests in every one of them."""
    from hpclab.backend import cuda

    rng = np.random.default_rng(z + m)
    a = rng.uniform(-1, 1, (z, m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (z, k, n)).astype(np.float32)
    c = cuda().device_array((z, m, n), np.float32)
    warp.launch(cuda().to_device(a), cuda().to_device(b), c)
    for i in range(z):
        assert_product(c.copy_to_host()[i], a[i], b[i])


# Split-K on the warp kernel: slices of whole k-tiles, a ragged last one, edges in every direction, B rows that
# are not in 16-byte runs; the layers are added in order, so two runs give the same bits.
@pytest.mark.parametrize("m, k, n, split", [(33, 70, 65, 3), (32, 64, 32, 2), (5, 100, 3, 5), (31, 9, 95, 4),
                                            (40, 200, 36, 16)])
def test_warp_split_k_matches_numpy_and_gives_the_same_bits_each_time(m, k, n, split):
    from hpclab.backend import cuda

    a, b = operands(m, k, n, np.float32, seed=m * k + n)
    da, db = cuda().to_device(a), cuda().to_device(b)
    runs = []
    for _ in range(2):
        c = cuda().to_device(np.full((m, n), np.nan, np.float32))
        warp.launch(da, db, c, split=split)
        runs.append(c.copy_to_host())
    assert_product(runs[0], a, b)
    assert runs[0].tobytes() == runs[1].tobytes()
    got, depth = split_k.slices(k, warp.CONFIG.bk, split)
    assert got <= split and (got - 1) * depth < k <= got * depth        # every slice has work, K is covered


# The plan for an H100's or H200's 132 SMs in the GPU's tile shapes (as warp.plan orders them): a grid that fills
# the GPU three times over stays whole; else slices where the tiles of C leave SMs idle and K is deep.
WIDE, SHORT, HALF = (warp.WarpConfig(), warp.WarpConfig(64, 128, 16, 32, 64, 2, 2),
                     warp.WarpConfig(128, 64, 16, 32, 64, 2, 2))


@pytest.mark.parametrize("m, n, k, splits", [(333, 777, 9000, range(4, 65)), (256, 256, 65536, range(16, 65)),
                                             (4096, 4096, 4096, [1]), (6000, 6000, 64, [1]), (8192, 8192, 8192, [1]),
                                             (64, 64, 1 << 16, range(32, 65)), (128, 128, 300, [1])])
def test_split_k_plan_splits_only_what_leaves_sms_idle(m, n, k, splits):
    configs = (HALF, SHORT, WIDE, HALF) if k < warp.SHALLOW_K else (WIDE, WIDE, SHORT, HALF)
    cfg, split = split_k.plan(m, n, k, configs, sms=132)
    assert split in splits, (cfg.label(), split)
    assert split == 1 or split_k.slices(k, cfg.bk, split)[1] >= split_k.MIN_SLICE
    first = configs[0]
    if -(-m // first.bm) * -(-n // first.bn) >= split_k.FULL_WAVES * 132 * first.blocks_per_sm():
        assert (cfg, split) == (first, 1)
        return
    # the model's choice is its best: no other shape or slicing it allows is faster by its own measure
    best = split_k.seconds(m, n, k, cfg, split, 132)
    allowed = [(c, s) for c in configs for s in (1, 2, 4) if s == 1 or split_k.slices(k, c.bk, s)[1] >= 256]
    assert all(best <= split_k.seconds(m, n, k, c, s, 132) for c, s in allowed)


def test_warp_launch_plans_on_this_backend():
    """On the simulator the plan is the first tile shape unsplit (no SMs to fill); on a GPU the model's."""
    cfg, split = warp.plan(333, 777, 9000)
    if SIM:
        assert (cfg, split) == (warp.CONFIG, 1)
    else:
        assert split > 1
        cfg, split = warp.plan(96, 96800, 363)     # AlexNet's C1 by GEMM: a tile C fills, not one that tests every load
        assert cfg.bm <= 96 and split == 1
        # a shallow product with an operand read transposed: 64 x 128 blocks (128 x 64 untransposed)
        assert warp.plan(8191, 4097, 1000, True) == (warp.SHORT, 1) and warp.plan(8191, 4097, 1000)[0] == warp.SHALLOW
        # a narrow C, untransposed: the narrow tile shapes (shapes the 64-wide tiles ran at 66 and 85 % of cuBLAS)
        assert warp.plan(14328, 14, 13600)[0] == warp.THIN and warp.plan(30, 12900, 3776)[0] == warp.FLAT
        assert warp.plan(14328, 14, 13600, True)[0] != warp.THIN and warp.plan(12000, 64, 12000)[0] != warp.THIN


def test_warp_kernel_refuses_what_it_cannot_multiply():
    with pytest.raises(ValueError) as err:
        mm.matmul(np.ones((32, 4)), np.ones((4, 32)), "warp")
    assert all(w in str(err.value) for w in ["float32", "float64", "kernel='fast'"]), err.value


def test_warp_kernel_reads_a_b_that_is_not_in_16_byte_runs():
    """A column slice starts 4 bytes into a row: it is read four bytes at a time instead."""
    from hpclab.backend import cuda

    a, b = operands(warp.CONFIG.bm, warp.CONFIG.bk, warp.CONFIG.bn + 1, np.float32, seed=5)
    c = mm.matmul(a, cuda().to_device(b)[:, 1:], "warp").copy_to_host()
    assert_product(c, a, b[:, 1:])


@pytest.mark.parametrize("split", [1, 3])
def test_warp_kernel_reads_16_byte_rows_that_end_inside_a_run(split):
    """B's rows start on 16-byte boundaries but its width is not a multiple of 4: on a GPU whole runs are read 16 bytes
    at a time, the last one value by value, never past N (the simulator checks every index), whole and split."""
    from hpclab.backend import cuda
    from hpclab.matmul.wide import aligned

    cfg = warp.CONFIG
    m, k, n = cfg.bm + 3, 3 * cfg.bk + 5, cfg.bn + 5
    a, b = operands(m, k, n + 3, np.float32, seed=6)
    db = cuda().to_device(b)[:, :n]
    assert aligned(db)
    c = cuda().device_array((m, n), np.float32)
    warp.launch(cuda().to_device(a), db, c, split=split)
    assert_product(c.copy_to_host(), a, b[:, :n])


def in_tiles(cfg, rows, depth, cols):
    """(M, K, N) given as (tiles, extra) of ``cfg``'s bm, bk and bn."""
    return tuple(t * size + extra for (t, extra), size in zip((rows, depth, cols), (cfg.bm, cfg.bk, cfg.bn)))


# C's last row and column of blocks shifted back to end at its edge: the overlapping outputs are computed twice, in
# the same order, so C is bit for bit what the build that tests every load gives (which the shift replaces wherever
# C is at least a tile each way); whole, with a ragged last tile of k, and in slices of K.
# Sizes in the tiles of this backend's warp.CONFIG: (rows, k, columns) as (tiles, extra), and the slices of K.
@pytest.mark.parametrize("rows, depth, cols, split", [((2, 6), (5, 0), (3, 4), 1), ((2, 6), (5, 3), (1, 9), 1),
                                                      ((1, 13), (25, 3), (1, 4), 3)])
def test_shifted_edge_tiles_give_the_bits_of_tested_loads(rows, depth, cols, split):
    from hpclab.backend import cuda
    from hpclab.matmul.wide import aligned

    cfg = warp.CONFIG
    m, k, n = in_tiles(cfg, rows, depth, cols)
    a, b = operands(m, k, n, np.float32, seed=m + n)
    da, db = cuda().to_device(a), cuda().to_device(b)
    c = cuda().device_array((m, n), np.float32)
    warp.launch(da, db, c, cfg, split=split)
    slices = split_k.slices(k, cfg.bk, split)[0]
    w = cuda().device_array((slices, m, n), np.float32)
    assert warp.kernel_for(da, db, w if slices > 1 else c, cfg, slices > 1) is warp.warp_kernel(
        cfg, False, aligned(db), False, slices > 1, shift=True, tail=bool(k % cfg.bk))
    tested = warp.warp_kernel(cfg, True, aligned(db), False, slices > 1)
    grid = (-(-n // cfg.bn), -(-m // cfg.bm)) + ((slices,) if slices > 1 else ())
    ref = cuda().device_array((m, n), np.float32)
    if slices > 1:
        tested[grid, cfg.threads](da, db, w)
        split_k.add(w, ref)
    else:
        tested[grid, cfg.threads](da, db, ref)
    assert_product(c.copy_to_host(), a, b)
    assert c.copy_to_host().tobytes() == ref.copy_to_host().tobytes()


# An operand stored transposed (a as K x M, b as N x K: a dense layer's backward products) is read in place, along
# its stored rows: the same sums in the same order as the untransposed product, so the same bits; small C (tested
# loads), C shifted at its edges with a ragged last tile of k, whole tiles, and in slices of K.
@pytest.mark.parametrize("config", WARP_CONFIGS)
@pytest.mark.parametrize("trans", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("rows, depth, cols, split", [((0, 19), (1, 3), (0, 21), 1), ((2, 3), (3, 5), (1, 7), 1),
                                                      ((1, 0), (2, 0), (2, 0), 1), ((1, 5), (4, 2), (1, 3), 3)])
def test_warp_kernel_reads_transposed_operands_in_place_bit_for_bit(config, trans, rows, depth, cols, split):
    from hpclab.backend import cuda

    m, k, n = in_tiles(config, rows, depth, cols)
    a, b = operands(m, k, n, np.float32, seed=m + 3 * n)
    plain = cuda().device_array((m, n), np.float32)
    warp.launch(cuda().to_device(a), cuda().to_device(b), plain, config, split=split)
    got = cuda().device_array((m, n), np.float32)
    warp.launch(cuda().to_device(np.ascontiguousarray(a.T) if trans[0] else a),
                cuda().to_device(np.ascontiguousarray(b.T) if trans[1] else b), got, config, split=split,
                trans_a=trans[0], trans_b=trans[1])
    assert_product(got.copy_to_host(), a, b)
    assert got.copy_to_host().tobytes() == plain.copy_to_host().tobytes()


# A narrow C's tile shapes, as on a GPU (lanes 8 x 4, which no other shape has; 4 x 8 outputs a lane in the second):
# C narrower than a tile (tested loads), shifted edges with a ragged last tile of k, and slices of K, each with the bits
# of another shape's 16-deep tiles (every output sums the same products in the same order).
THIN, FLAT = warp.WarpConfig(256, 32, 16, 64, 32, 2, 2), warp.WarpConfig(32, 128, 16, 32, 32, 1, 2)
DEEP16 = warp.WarpConfig(32, 32, 16, 16, 32, 1, 1)


@pytest.mark.parametrize("config, m, k, n, split", [(THIN, 300, 37, 14, 1), (THIN, 270, 35, 45, 1),
                                                    (THIN, 256, 64, 32, 3), (FLAT, 30, 37, 200, 1),
                                                    (FLAT, 45, 35, 140, 1), (FLAT, 32, 64, 128, 3)])
def test_narrow_tile_shapes_match_numpy_with_the_bits_of_other_tiles(config, m, k, n, split):
    from hpclab.backend import cuda

    if not SIM:
        assert (warp.THIN, warp.FLAT) == (THIN, FLAT)      # the shapes plan() takes
    a, b = operands(m, k, n, np.float32, seed=m + 7 * n)
    da, db = cuda().to_device(a), cuda().to_device(b)
    got, ref = (cuda().device_array((m, n), np.float32) for _ in range(2))
    warp.launch(da, db, got, config, split=split)
    warp.launch(da, db, ref, DEEP16, split=split)
    assert_product(got.copy_to_host(), a, b)
    assert got.copy_to_host().tobytes() == ref.copy_to_host().tobytes()


def test_warp_kernel_names_a_tile_shape_that_cannot_read_a_transposed_operand():
    cfg = warp.WarpConfig(128, 16, 16, 64, 16, 2, 1)   # 64 threads: fewer than a row of A^T's 128-wide tile
    assert cfg.problems() == [] and cfg.problems(trans_b=True) == []
    with pytest.raises(ValueError, match="transposed A"):
        warp.warp_kernel(cfg, trans_a=True)
    with pytest.raises(ValueError, match="transposed B is read value by value"):
        warp.warp_kernel(warp.CONFIG, runs=True, trans_b=True)
    with pytest.raises(ValueError, match="batched product"):
        warp.warp_kernel(warp.CONFIG, batched=True, trans_a=True)


def test_a_kernel_asked_for_in_different_words_is_built_once():
    """The bench reads the registers and SASS of the fast kernel the launch compiled: the same object, whether the
    defaults are spelled out or not."""
    cfg = mm.fast_config(np.float32)
    assert mm.fast_kernel(np.float32, cfg) is mm.fast_kernel(np.dtype(np.float32), cfg, False, False, split=1)
    assert mm.fast_kernel(np.float32, cfg, split=2) is not mm.fast_kernel(np.float32, cfg)


def test_warp_configurations_that_cannot_be_built_are_named():
    with pytest.raises(ValueError, match="32 lanes"):
        warp.warp_kernel(warp.WarpConfig(128, 128, 16, 64, 64, 2, 2))


def test_warp_tiles_deeper_than_the_written_out_steps_are_refused():
    with pytest.raises(ValueError, match="bk must be 4, 8, 12 or 16"):
        warp.warp_kernel(warp.WarpConfig(32, 32, 32, 16, 32, 1, 1))


def test_the_kernels_a_notebook_shows_are_plain():
    """Top-level kernels of one idea: short, no simulator branch, the tile a compile-time constant."""
    import inspect

    for kernel in (naive.naive_kernel, tiled.tiled_kernel):
        source = inspect.getsource(kernel.py_func)
        assert source.count("\n") <= 60 and "is_simulator" not in source and "backend" not in source, source
    assert tiled.TILE == (16 if SIM else 32)          # 32 x 32 on a GPU: the recorded 15.4 % of cuBLAS


# Transposed operands are read in place by the fast and warp kernels (a stored
# K x M, b stored N x K), as a dense layer's backward pass needs, and through x.T by the
# naive and tiled ones; float16 inputs are multiplied in float32 by the fast kernel.
@pytest.mark.parametrize("trans", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("kernel, dtype", [(k, d) for k in mm.KERNELS for d in (np.float32, np.float64)]
                         + [("fast", np.float16), ("warp", np.float32)])
def test_transposed_and_half_operands_match_numpy(kernel, dtype, trans):
    a, b = operands(19, 13, 21, dtype, seed=4)
    a_in = np.ascontiguousarray(a.T) if trans[0] else a
    b_in = np.ascontiguousarray(b.T) if trans[1] else b
    c = mm.matmul(a_in, b_in, kernel, trans_a=trans[0], trans_b=trans[1])
    if dtype == np.float16:
        assert c.dtype == np.float32            # accumulated and returned in float32
        a, b = a.astype(np.float32), b.astype(np.float32)
    assert_product(c, a, b)


def test_half_inputs_into_a_half_out_and_a_transposed_fast_configuration():
    a, b = operands(40, 17, 20, np.float16, seed=5)
    out = mm.cuda.device_array((40, 20), np.float16)
    got = mm.matmul(mm.cuda.to_device(np.ascontiguousarray(a.T)), mm.cuda.to_device(b), "fast",
                    out=out, trans_a=True).copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())
    # The GPU's default tile shape (256 threads, 16-byte runs), both operands transposed.
    a, b = operands(130, 9, 3, np.float32, seed=6)
    c = mm.matmul(np.ascontiguousarray(a.T), np.ascontiguousarray(b.T), "fast",
                  config=mm.FAST_CONFIG[np.dtype(np.float32)], trans_a=True, trans_b=True)
    assert_product(c, a, b)


# Split-K: the blocks of slice z write their partial sums into layer z of a workspace, added in order.
# Slices that end mid-tile, a slice with one tile, more slices than tiles of K, every transpose.
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("k, split", [(4, 2), (9, 2), (37, 2), (37, 3), (37, 64)])
def test_split_k_matches_numpy_and_gives_the_same_bits_each_time(trans, k, split):
    a, b = operands(21, k, 18, np.float32, seed=7)
    da = mm.cuda.to_device(np.ascontiguousarray(a.T) if trans[0] else a)
    db = mm.cuda.to_device(np.ascontiguousarray(b.T) if trans[1] else b)
    runs = []
    for _ in range(2):
        c = mm.cuda.to_device(np.full((21, 18), np.nan, np.float32))   # every element written by the launch
        mm.launch("fast", da, db, c, trans_a=trans[0], trans_b=trans[1], split=split)
        runs.append(c.copy_to_host())
    assert_product(runs[0], a, b)
    assert runs[0].tobytes() == runs[1].tobytes()


def test_split_k_slices_add_in_order_and_two_give_the_unsplit_sum_of_halves():
    """Two slices: C = (first half's sum) + (second half's sum), each half summed by the unsplit kernel."""
    cfg = mm.fast_config(np.float32)
    k = 8 * cfg.bk                                            # two slices of four tiles each
    a, b = operands(19, k, 23, np.float32, seed=3)
    c = mm.cuda.device_array((19, 23), np.float32)
    mm.launch("fast", mm.cuda.to_device(a), mm.cuda.to_device(b), c, split=2)
    halves = [mm.matmul(a[:, h * k // 2:(h + 1) * k // 2], b[h * k // 2:(h + 1) * k // 2], "fast") for h in (0, 1)]
    assert c.copy_to_host().tobytes() == (halves[0] + halves[1]).tobytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_split_k_leaves_other_dtypes_whole(dtype):
    """The slices' workspace is float32: a float64 (or float16-in) product asked to split runs unsplit."""
    a, b = operands(21, 37, 18, dtype, seed=5)
    da, db = mm.cuda.to_device(a), mm.cuda.to_device(b)
    split, whole = (mm.cuda.device_array((21, 18), dtype) for _ in range(2))
    mm.launch("fast", da, db, split, split=4)
    mm.launch("fast", da, db, whole, split=1)
    assert split.copy_to_host().tobytes() == whole.copy_to_host().tobytes()
    assert_product(split.copy_to_host(), a, b)


def test_split_k_workspace_views_are_made_once_and_grow_with_the_product(monkeypatch):
    monkeypatch.setattr(split_k, "_workspaces", {})               # no buffer yet, whatever ran before
    first = split_k.workspace(3, 5, 7, stream=0)
    assert tuple(first.shape) == (3, 5, 7) and split_k.workspace(3, 5, 7, stream=0) is first
    other = split_k.workspace(2, 5, 7, stream=0)                  # fits the buffer: a second view of it
    assert tuple(other.shape) == (2, 5, 7) and split_k.workspace(3, 5, 7, stream=0) is first
    big = split_k.workspace(4, 50, 70, stream=0)                  # does not fit: a new buffer, new views
    assert tuple(big.shape) == (4, 50, 70) and split_k.workspace(3, 5, 7, stream=0) is not first


def test_split_k_is_planned_for_grids_that_leave_sms_idle_only():
    cfg = mm.FAST_CONFIG[np.dtype(np.float32)]
    if SIM:       # the simulator has no SMs to fill: never split there
        assert mm.split_for(64, 64, 1 << 14, mm.fast_config(np.float32), np.float32, np.float32) == 1
        return
    sms = split_k.current_sms()
    assert mm.split_for(333, 777, 9000, cfg, np.float32, np.float32) > 2      # 21 tiles of C, deep K
    assert mm.split_for(512, 4096, 4096, cfg, np.float32, np.float32) >= 2    # a dense layer at 512 a GPU
    assert mm.split_for(8192, 8192, 4096, cfg, np.float32, np.float32) == 1   # the grid fills the GPU
    assert mm.split_for(128, 128 * sms, 64, cfg, np.float32, np.float32) == 1  # too shallow to share
    assert mm.split_for(333, 777, 9000, cfg, np.float64, np.float64) == 1     # float32 only
    assert mm.split_for(333, 777, 9000, cfg, np.float16, np.float16) == 1


@pytest.mark.parametrize("kernel", mm.KERNELS)
def test_degenerate_shapes(kernel):
    for m, k, n in [(1, 1, 1), (3, 1, 2), (1, 7, 1)]:
        a, b = operands(m, k, n, np.float64, seed=m + k + n)
        assert_product(mm.matmul(a, b, kernel), a, b)


def test_device_arrays_stay_on_device_and_out_is_used():
    a, b = operands(9, 10, 11, np.float32)
    da, db = mm.cuda.to_device(a), mm.cuda.to_device(b)
    out = mm.cuda.device_array((9, 11), dtype=np.float32)
    got = mm.matmul(da, db, "fast", out=out)
    assert got is out and hasattr(got, "copy_to_host")
    assert_product(got.copy_to_host(), a, b)
    host_out = np.empty((9, 11), dtype=np.float32)
    assert mm.matmul(a, b, "naive", out=host_out) is host_out
    assert_product(host_out, a, b)


def test_non_contiguous_numpy_input():
    a, b = operands(12, 8, 6, np.float64)
    assert_product(mm.matmul(np.asfortranarray(a), b[:, ::1], "tiled"), a, b)


@pytest.mark.parametrize("a, b, words", [
    (np.ones((3, 4), np.float32), np.ones((5, 2), np.float32), ["a's columns (4)", "b's rows (5)"]),
    (np.ones(4, np.float32), np.ones((4, 2), np.float32), ["2-D", "1-D"]),
    (np.ones((0, 4), np.float32), np.ones((4, 2), np.float32), ["empty", "(0, 4)"]),
    (np.ones((3, 4), np.int32), np.ones((4, 2), np.int32), ["int32", "float32 and float64"]),
    (np.ones((3, 4), np.complex64), np.ones((4, 2), np.complex64), ["complex64", "float32 and float64"]),
    (np.ones((3, 4), np.float32), np.ones((4, 2), np.float64), ["float32", "float64", "same dtype"]),
])
def test_bad_input_is_explained(a, b, words):
    with pytest.raises(ValueError) as err:
        mm.matmul(a, b, "naive")
    for w in words:
        assert w in str(err.value)


def test_bad_kernel_out_and_config():
    a, b = operands(3, 4, 2, np.float32)
    with pytest.raises(ValueError, match="unknown kernel 'blas'"):
        mm.matmul(a, b, "blas")
    with pytest.raises(ValueError, match="must be a 3 x 2 float32"):
        mm.matmul(a, b, "naive", out=np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match="cannot be built"):
        mm.fast_kernel(np.dtype(np.float32), mm.FastConfig(128, 128, 8, 6, 8))
    with pytest.raises(ValueError, match="a.T's columns \\(3\\) must equal b's rows \\(4\\)"):
        mm.matmul(a, np.ones((4, 2), np.float32), "fast", trans_a=True)
    with pytest.raises(ValueError, match="must be a 4 x 4 float32 \\(or float16\\)"):
        mm.matmul(a.astype(np.float16).T, a.astype(np.float16), "fast", out=np.empty((4, 4), np.float64))
    for kernel in ("naive", "tiled"):
        with pytest.raises(ValueError, match=f"the {kernel} kernel multiplies float32 or float64; float16 "
                                             "inputs are multiplied in float32 by kernel='fast'"):
            mm.matmul(a.astype(np.float16), a.astype(np.float16).T, kernel)
    with pytest.raises(ValueError, match="transposed A the threads must be a multiple of bm"):
        mm.fast_kernel(np.dtype(np.float32), mm.FastConfig(32, 16, 4, 8, 4, vec=4, pad=4), True)


def test_add_scaled():
    from hpclab.matmul.run_reduce import add_scaled

    x, y = operands(5, 7, 1, np.float32)[0], operands(5, 7, 1, np.float32, seed=3)[0]
    dy = mm.cuda.to_device(y)
    add_scaled(dy, -0.5, mm.cuda.to_device(x))
    np.testing.assert_allclose(dy.copy_to_host(), y - 0.5 * x, rtol=1e-6)


def test_tutorial_closed_form():
    from hpclab.matmul.run_reduce import closed_form_sum, reference_sums

    # rank r's C has N^2 elements, each (1 + r) * 0.5 * N: 8388608 per unit of (1 + r) at N = 256
    assert closed_form_sum(256, 1) == 8388608.0
    assert closed_form_sum(256, 2) == 8388608.0 * (1 + 2) == 25165824.0
    assert closed_form_sum(256, 4) == 8388608.0 * 10
    assert reference_sums(8, 3, "tutorial", 0, np.float32, 1, 0.1) == [closed_form_sum(8, 3)]


def test_check_explains_wrong_products():
    from hpclab.matmul import check

    a, b = operands(37, 29, 53, np.float32)
    c = a @ b
    assert check.product(c, a, b, tile=8, quiet=True)
    assert "transpose" in check.product(c.T, a, b, tile=8, quiet=True).message
    edge = c.copy()
    edge[32:] = 0
    assert "last partial tile" in check.product(edge, a, b, tile=8, quiet=True).message
    short = a[:, :24] @ b[:24]
    assert "last 5 terms" in check.product(short, a, b, tile=8, quiet=True).message
    assert "rank 0's share" in check.global_sum(8388608, 256, 2, quiet=True).message
    assert check.global_sum(25165824, 256, 2, quiet=True)


# ---- under mpiexec -----------------------------------------------------------

@pytest.mark.mpi
def test_matmul_reduce_reports_closed_form_sum():
    proc = run_mpi(2, "run", "matmul-reduce", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc)
    n = out["result"]["n"]
    assert n == (32 if SIM else 256)
    # sum over ranks r = 0, 1 of N^2 elements each equal to (1 + r) * 0.5 * N
    assert out["result"]["global_sum"] == sum(n * n * (1 + r) * 0.5 * n for r in range(2))
    assert out["result"]["expected_sum"] == out["result"]["global_sum"]
    assert out["passed"] and out["timings"]["wall_s"] > 0
    assert {"compute_s", "transfer_s", "comm_s"} <= set(out["timings"])


@pytest.mark.mpi
def test_matmul_reduce_training_loop_random():
    proc = run_mpi(3, "run", "matmul-reduce", "--n", "12", "--init", "random", "--seed", "5",
                   "--iterations", "3", "--kernel", "fast", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc)["result"]
    assert len(out["global_sums"]) == 3
    np.testing.assert_allclose(out["global_sums"], out["expected_sums"], rtol=1e-5)
    assert out["global_sums"][0] > out["global_sums"][2]      # the gradient step lowers the loss
    assert len(out["per_iteration_s"]) == 3


@pytest.mark.mpi
def test_distributed_matmul_independent_of_rank_count():
    results = []
    for ranks in (2, 3):        # 20 rows: 10 + 10, then 7 + 7 + 6
        proc = run_mpi(ranks, "run", "matmul", "--n", "20", "--kernel", "tiled", "--json", timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = last_json(proc)
        assert out["passed"] and out["result"]["max_rel_error"] <= out["result"]["tolerance"]
        assert sum(out["result"]["rows_per_rank"]) == 20
        results.append(out)
    assert results[1]["result"]["rows_per_rank"] == [7, 7, 6]
    assert results[0]["result"]["c_checksum"] == results[1]["result"]["c_checksum"]
    assert results[0]["timings"]["wall_s"] > 0


@pytest.mark.mpi
def test_distributed_matmul_too_few_rows_fails_fast():
    proc = run_mpi(3, "run", "matmul", "--n", "2", timeout=60)
    assert proc.returncode == 2               # on every rank, said once by rank 0
    assert proc.stderr.count("--n 2: 2 rows cannot be shared among 3 ranks") == 1, proc.stderr
    assert "mpiexec -n 2" in proc.stderr


@pytest.mark.mpi
def test_matmul_reduce_bad_learning_rate():
    proc = run_mpi(2, "run", "matmul-reduce", "--lr", "-1", timeout=60)
    assert proc.returncode == 2
    assert "argument --lr: -1 is out of range; give a finite number of at least 0" in proc.stderr


def test_large_products_are_checked_on_every_ranks_edge_rows():
    from hpclab.matmul.run_matmul import FULL_CHECK_N, SAMPLED_ROWS, check_rows

    assert list(check_rows(100, 3, 0)) == list(range(100))
    rows = check_rows(4099, 3, 0)
    edges = {0, 1366, 1367, 2732, 2733, 4098}          # first and last row of each rank's band
    assert edges <= set(rows.tolist()) and rows.max() < 4099
    assert FULL_CHECK_N < 4099 and SAMPLED_ROWS <= rows.size <= SAMPLED_ROWS + len(edges)


def test_paired_times_take_turns_and_give_each_its_median():
    """The bench's kernel/cuBLAS ratio: both timed in turns, so drift reaches both alike."""
    import time

    from hpclab.timing import median_times

    calls = []
    slow = lambda: (calls.append("fn"), time.sleep(0.004))      # noqa: E731
    fast = lambda: (calls.append("ref"), time.sleep(0.001))     # noqa: E731
    t_fn, t_ref = median_times(slow, fast, repeats=3, warmup=1)
    assert calls == ["fn", "ref"] * 4
    assert 0.004 <= t_fn < 0.04 and 0.001 <= t_ref < t_fn
