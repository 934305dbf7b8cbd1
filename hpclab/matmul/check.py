"""Checks for the matrix-multiply exercises: is C = A @ B, and if not, what went wrong.

A wrong product usually has a recognisable shape: the transpose of the answer (rows and columns swapped), right except
in the last partial tile (edge handling), only the first k-tile summed (accumulation), the last partial k-tile
missing, results that change from run to run (a missing ``cuda.syncthreads()``), or nothing written at all.
"""
from __future__ import annotations

import numpy as np

from hpclab.verdict import Verdict, say


def tolerance(dtype, k: int) -> float:
    """Largest error accepted, relative to max|C|: rounding grows about like sqrt(k)."""
    eps = np.finfo(np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.float64).eps
    return 8 * eps * max(1.0, np.sqrt(k))


def _close(x, ref, tol) -> bool:
    scale = float(np.abs(ref).max()) or 1.0
    return x.shape == ref.shape and bool(np.all(np.abs(x - ref) <= tol * scale))


def diagnose(c, a, b, tile: int | None = None) -> str | None:
    """None when c is a @ b (within rounding), else a sentence saying what c looks like instead."""
    a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
    (m, k), n = a.shape, b.shape[1]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    tol = tolerance(a.dtype, k)
    if c.shape != (m, n):
        if c.shape == (n, m) and _close(c.T, ref, tol):
            return (f"the result has shape {c.shape} and is the transpose of A @ B ({m} x {n}): "
                    "rows and columns are swapped. cuda.grid(2) returns (x, y) and x is the column "
                    "index when blockIdx.x runs along C's columns")
        return f"the result has shape {c.shape}; A @ B is {m} x {n} (rows of A by columns of B)"
    if not np.all(np.isfinite(c)):
        bad = np.argwhere(~np.isfinite(c))[0]
        return (f"C[{bad[0]}, {bad[1]}] is {c[tuple(bad)]}: some elements were never written or read "
                "memory outside the matrix (uninitialised output, or a missing bounds check)")
    if _close(c, ref, tol):
        return None
    if not np.any(c):
        return ("C is all zeros: the kernel wrote nothing (was it launched, with a grid that covers C, "
                "and was the result copied back from the device?)")
    if m == n and _close(c, ref.T, tol):
        return ("C is the transpose of A @ B: rows and columns are swapped (x from cuda.grid(2) is the "
                "column, y the row)")
    if _close(c, 2 * ref, tol):
        return "C is exactly twice A @ B: the output was accumulated into twice (launched twice, or out not reset)"
    if tile:
        full = (k // tile) * tile
        if 0 < full < k and _close(c, a64[:, :full] @ b64[:full], tol):
            return (f"C misses the last {k - full} terms of every dot product: the loop over k-tiles "
                    f"stops at K // TILE = {k // tile}; use ceil(K / TILE) tiles and load zeros past K")
        if 0 < full < k and k > tile:
            # Threads past K that skip their load leave the previous k-tile's values in As and Bs,
            # so the partial tile adds the previous tile's tail a second time.
            tail = slice(k - tile, full)
            if _close(c, ref + a64[:, tail] @ b64[tail], tol):
                return (f"every element of C has {tile - (k - full)} extra products: in the last, partial k-tile "
                        f"(k from {full} to {k - 1}) the threads past K skipped their load, so As and Bs still "
                        "held the previous tile's values, which were added again. Write a zero instead of "
                        "skipping: As[ty, tx] = a[row, k0 + tx] if row < M and k0 + tx < K else 0, and the "
                        "same for Bs")
        first = min(tile, k)
        if first < k and _close(c, a64[:, :first] @ b64[:first], tol):
            return (f"C holds only the first {first} terms of every dot product: the sum is reset or "
                    "overwritten for each k-tile instead of accumulated over all of them")
    wrong = np.abs(c - ref) > tol * (float(np.abs(ref).max()) or 1.0)
    rows, cols = np.flatnonzero(wrong.any(axis=1)), np.flatnonzero(wrong.any(axis=0))
    if tile:
        edge_r, edge_c = (m // tile) * tile, (n // tile) * tile
        if (rows.min() >= edge_r or cols.min() >= edge_c) and (edge_r < m or edge_c < n):
            return (f"C is right except in the last partial tile (wrong rows {rows.min()}..{rows.max()}, "
                    f"columns {cols.min()}..{cols.max()}; full tiles end at row {edge_r}, column "
                    f"{edge_c}): at the edges, load zeros for elements outside A and B (row < M, "
                    f"k < K, col < N) instead of skipping the load or reading past the end")
    i, j = np.argwhere(wrong)[0]
    hint = ""
    if tile and k % tile and wrong.mean() > 0.5:
        hint = (f"; K = {k} is not a whole number of tiles of {tile}, and most elements are wrong: check the "
                "last, partial k-tile, where elements past K must be loaded as zeros, not skipped")
    return (f"{int(wrong.sum())} of {c.size} elements are wrong, the first C[{i}, {j}] = {float(c[i, j]):.7g} "
            f"instead of {float(ref[i, j]):.7g} (rows {rows.min()}..{rows.max()}, columns {cols.min()}..{cols.max()})"
            + hint)


def product(c, a, b, tile: int | None = None, quiet: bool = False) -> Verdict:
    """Check one result C against A @ B computed by NumPy in float64."""
    problem = diagnose(c, a, b, tile)
    (m, k), n = np.shape(a), np.shape(b)[1]
    return say(Verdict(problem is None, problem or f"C ({m} x {n}) equals A @ B to rounding (K = {k})"), quiet)


def kernel(matmul_fn, tile: int | None = None, dtypes=(np.float32, np.float64), seed: int = 0,
           quiet: bool = False) -> Verdict:
    """Run ``matmul_fn(a, b) -> C`` (NumPy in, NumPy out) on awkward shapes and check each: a square one
    of whole tiles, odd ones that are not (the edges) and a 1 x 1, each twice, because results that
    change from run to run point to a missing ``cuda.syncthreads()``."""
    rng = np.random.default_rng(seed)
    t = tile or 8
    shapes = [(2 * t, 2 * t, 2 * t), (37, 29, 53), (t + 1, 2 * t + 3, t - 1 if t > 1 else 1), (1, 1, 1)]
    for dtype in dtypes:
        for m, k, n in shapes:
            a, b = rng.uniform(-1, 1, (m, k)).astype(dtype), rng.uniform(-1, 1, (k, n)).astype(dtype)
            first, second = np.asarray(matmul_fn(a, b)), np.asarray(matmul_fn(a, b))
            if first.shape == second.shape and not np.array_equal(first, second):
                return say(Verdict(False, (
                    f"{m} x {k} @ {k} x {n} {np.dtype(dtype).name}: two runs on the same input gave "
                    "different results. That is a race: threads read a shared tile before all of it "
                    "is written, or overwrite it while others still read it. Put cuda.syncthreads() "
                    "after loading the tiles and again after using them")), quiet)
            problem = diagnose(first, a, b, tile)
            if problem is not None:
                return say(Verdict(False, f"{m} x {k} @ {k} x {n} {np.dtype(dtype).name}: {problem}"), quiet)
            if np.dtype(first.dtype) != np.dtype(dtype):
                return say(Verdict(False, f"the result is {first.dtype} for {np.dtype(dtype).name} inputs: "
                                          "allocate C with the inputs' dtype"), quiet)
    names = ", ".join(f"{m}x{k}@{k}x{n}" for m, k, n in shapes)
    return say(Verdict(True, f"matches NumPy for {names} in {', '.join(np.dtype(d).name for d in dtypes)}, "
                             "the same on repeated runs"), quiet)


def global_sum(value: float, n: int, ranks: int, quiet: bool = False) -> Verdict:
    """The tutorial's aggregated sum: N^3 / 2 x (1 + 2 + ... + P) for A = 1 + rank, B = 0.5."""
    right = n ** 3 / 2 * ranks * (ranks + 1) / 2
    value = float(value)
    if value == right:
        return say(Verdict(True, f"{value:.2f} = N^3/2 x P(P+1)/2 with N = {n}, P = {ranks}"), quiet)
    known = [(n ** 3 / 2, " is rank 0's share alone (N^3/2); every rank r adds (1 + r) x N^3/2 - this is the "
                          "tutorial's printed value"),
             (right / n, f" is a factor N = {n} too small: each element of C is a sum of N products, "
                         "(1 + r) x 0.5 x N, and there are N^2 of them"),
             (n ** 3 / 2 * ranks, " counts every rank as rank 0: rank r's A holds 1 + r")]
    why = next((why for wrong, why in known if value == wrong),
               f"; the sum over ranks of N^2 x (1 + r) x 0.5 x N is {right:.2f}")
    return say(Verdict(False, f"{value:.2f}{why}"), quiet)
