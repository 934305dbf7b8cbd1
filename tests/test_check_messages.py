"""The exercise checks name the mistake: each wrong answer a learner is likely to write gets its message."""
from __future__ import annotations

import numpy as np

from hpclab.collectives import check as collectives
from hpclab.halo import check as halo
from hpclab.matmul import check as matmul
from hpclab.pi import check as pi
from hpclab.decomp import block_range
from hpclab.pi import mc
from hpclab.pi.reduce import block_sum
from hpclab.matmul.tiled import cuda

import numba  # noqa: E402 - after hpclab kernel modules, which pick the simulator before numba.cuda loads


# ---- notebook 02: the midpoint kernel -------------------------------------------------

def _rule(bins: int, offset: float) -> float:
    x = (np.arange(bins) + offset) / bins
    return float(np.sum(4.0 / (1.0 + x * x)) / bins)


def test_midpoint_check_recognises_endpoint_rules():
    bins = 1001                                              # the exercise's size on the simulator
    assert pi.midpoint(_rule(bins, 0.5), bins, ranks=4, blocks=2, threads=32, quiet=True)
    left = pi.midpoint(_rule(bins, 0.0), bins, ranks=4, blocks=2, threads=32, quiet=True)
    assert not left and "left-endpoint rule" in left.message and "(i + 0.5) * h" in left.message
    assert "lost or counted twice" not in left.message
    right = pi.midpoint(_rule(bins, 1.0), bins, ranks=4, blocks=2, threads=32, quiet=True)
    assert not right and "right-endpoint rule" in right.message


def test_midpoint_check_recognises_a_missing_factor_h_and_lost_bins():
    bins = 1001
    no_h = pi.midpoint(_rule(bins, 0.5) * bins, bins, quiet=True)
    assert not no_h and "multiply the sum by the bin width" in no_h.message
    x = (np.arange(1, bins) + 0.5) / bins                     # bin 0 lost
    lost = pi.midpoint(float(np.sum(4.0 / (1.0 + x * x)) / bins), bins, quiet=True)
    assert not lost and "bins are lost" in lost.message


# ---- notebook 03: the hit-counting kernel ---------------------------------------------

@cuda.jit
def _hits_from_zero(start, count, seed, out):
    """The slip of forgetting the rank's offset: every rank counts samples 0 .. count-1."""
    t = cuda.grid(1)
    hits = 0
    for i in range(t, count, cuda.gridsize(1)):
        if mc.sample_inside(seed, i):
            hits += 1
    block_sum(hits, out)


def test_hit_count_check_names_a_missing_start_offset():
    samples, ranks, seed = 401, 4, 123
    total = 0
    for r in range(ranks):                                    # what the ranks would add up
        a, b = block_range(samples, ranks, r)
        out = cuda.to_device(np.zeros(1, dtype=np.uint64))
        _hits_from_zero[1, 32](a, b - a, np.uint64(seed), out)
        total += int(out.copy_to_host()[0])
    library = mc.count_hits_reference(0, samples, seed)
    verdict = pi.hit_count(total, library, samples, ranks=ranks, seed=seed, quiet=True)
    assert not verdict and "start the loop at start + t" in verdict.message
    assert pi.hit_count(library, library, samples, ranks=ranks, seed=seed, quiet=True)


def test_hit_count_check_explains_too_many_too_few_and_none():
    assert "more hits than samples" in pi.hit_count(500, 310, 400, quiet=True).message
    assert "counted twice" in pi.hit_count(320, 310, 400, quiet=True).message
    assert "skipped" in pi.hit_count(300, 310, 400, quiet=True).message
    assert "counted none" in pi.hit_count(0, 310, 400, quiet=True).message


# ---- notebook 01: predicting the collectives -------------------------------------------

def test_collective_check_accepts_the_slides_spelling_and_explains_the_format():
    assert collectives.collective("Reduce", [[10], [2], [3], [4]], quiet=True)
    assert collectives.collective("AllReduce", [[10]] * 4, quiet=True)
    assert collectives.collective("all-gather", [[1, 2, 3, 4]] * 4, quiet=True)
    unknown = collectives.collective("Reduction", [[10], [2], [3], [4]], quiet=True)
    assert not unknown and "'Reduction' is not one of the collectives" in unknown.message
    assert "reduce, allreduce" in unknown.message
    flat = collectives.collective("reduce", [10, 2, 3, 4], quiet=True)
    assert not flat and "one list per GPU" in flat.message


# ---- notebook 04: the tiled kernel ----------------------------------------------------

TILE = 4


@cuda.jit
def _tiled_skipping_edges(a, b, c):
    """The exercise's tiled kernel with the edge loads skipped instead of zero-filled."""
    As = cuda.shared.array((TILE, TILE), numba.float32)
    Bs = cuda.shared.array((TILE, TILE), numba.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    M, K = a.shape
    N = b.shape[1]
    s = numba.float32(0)
    for k0 in range(0, K, TILE):
        if row < M and k0 + tx < K:
            As[ty, tx] = a[row, k0 + tx]
        if k0 + ty < K and col < N:
            Bs[ty, tx] = b[k0 + ty, col]
        cuda.syncthreads()
        for kk in range(TILE):
            s += As[ty, kk] * Bs[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        c[row, col] = s


def test_tiled_check_recognises_an_edge_load_skipped_instead_of_zero_filled():
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (5, 7)).astype(np.float32)        # K = 7: one whole tile and a partial one
    b = rng.uniform(-1, 1, (7, 6)).astype(np.float32)
    c = cuda.device_array((5, 6), dtype=np.float32)
    _tiled_skipping_edges[(2, 2), (TILE, TILE)](cuda.to_device(a), cuda.to_device(b), c)
    verdict = matmul.product(c.copy_to_host(), a, b, tile=TILE, quiet=True)
    assert not verdict
    assert "skipped their load" in verdict.message and "Write a zero instead of skipping" in verdict.message


def test_math_of_the_stale_tile_model():
    """The message's arithmetic: the partial tile re-adds the previous tile's tail (checked in NumPy)."""
    rng = np.random.default_rng(2)
    a, b = rng.uniform(-1, 1, (9, 29)), rng.uniform(-1, 1, (29, 8))
    stale = a @ b + a[:, 13:16] @ b[13:16]                   # TILE 16: tail k = 13, 14, 15 re-added
    assert "3 extra products" in matmul.diagnose(stale, a, b, tile=16)


# ---- notebook 06: halo extents and the exchange ----------------------------------------

def _extent(height, kernel, stride, pad, size, rank, clip=True, out_rows=None):
    """The exercise's answer, with the slips a learner makes as options."""
    ho = (height + 2 * pad - kernel) // stride + 1
    o0, o1 = out_rows(ho, size, rank) if out_rows else block_range(ho, size, rank)
    lo, hi = o0 * stride - pad, (o1 - 1) * stride - pad + kernel
    return (o0, o1, max(lo, 0), min(hi, height)) if clip else (o0, o1, lo, hi)


def test_halo_extent_check_names_unclipped_padding_and_wrong_bands():
    assert halo.halo_extents(_extent, quiet=True)
    unclipped = halo.halo_extents(lambda *a: _extent(*a, clip=False), quiet=True)
    assert not unclipped and "clip [lo, hi) to the image" in unclipped.message
    by_input = halo.halo_extents(lambda h, *a: _extent(h, *a, out_rows=lambda ho, s, r: block_range(h, s, r)),
                                 quiet=True)
    assert not by_input and "the output rows are hcomm.block_range(output height" in by_input.message
    short = halo.halo_extents(lambda *a: (*_extent(*a)[:3], _extent(*a)[3] - 1), quiet=True)
    assert not short and "so the band reads [o0*stride - pad, (o1-1)*stride - pad + R)" in short.message
    raised = halo.halo_extents(lambda *a: 1 / 0, quiet=True)
    assert not raised and "your function raised ZeroDivisionError" in raised.message


def test_exchange_check_names_the_wrong_rows_and_where_they_come_from():
    full = np.arange(2 * 3 * 27 * 4, dtype=np.float32).reshape(2, 3, 27, 4)
    h, r, s, p, size, rank = 27, 5, 1, 2, 3, 1                # C2's geometry, the middle rank of 3
    lo, hi = _extent(h, r, s, p, size, rank)[2:]
    work = full[:, :, lo:hi].copy()
    assert halo.exchange(work, full, h, r, s, p, size, rank, quiet=True)
    short = halo.exchange(work[:, :, 1:], full, h, r, s, p, size, rank, quiet=True)
    assert not short and "the working buffer has shape" in short.message
    work[:, :, -1] = 0                                        # the last halo row never arrived
    below = halo.exchange(work, full, h, r, s, p, size, rank, quiet=True)
    assert not below and f"input rows [{hi - 1}] are wrong" in below.message
    assert "rows below its band (from rank 2)" in below.message
