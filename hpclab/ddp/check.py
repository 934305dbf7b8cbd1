"""Data-parallel training: the learner's gradient averaging, replicas, 1 vs n ranks.

Every rank all-reduces its gradient bucket and divides, so that it holds the mean gradient over the global
batch, what one GPU computes; the checks compare with that and name the usual mistake when the answer is
off by its factor. ``local`` says what each rank's gradient was: ``"sum"`` over its own samples (divide
the all-reduced sum by the global batch B) or ``"mean"``, as PyTorch's (divide by the number of ranks N).
With ``outputs`` > 1 (notebook 07's mean squared error, which averages over the B x outputs values of the
batch, as PyTorch's MSELoss does) a ``"sum"`` gradient is divided by B x outputs.
"""
from __future__ import annotations

import numpy as np

from hpclab.verdict import Verdict, say as _say

LOCAL = ("sum", "mean")


def _mistakes(local: str, batch: int, ranks: int, outputs: int = 1) -> list[tuple[float, str]]:
    """(factor of the wrong answer over the right one, what was done) for usual mistakes."""
    per = batch / ranks
    if local == "sum":
        divisor = batch * outputs
        by = (f"the global batch B = {batch}" if outputs == 1 else
              f"B x outputs = {batch} x {outputs} = {divisor}, the number of values the mean runs over")
        wrong = [
            (divisor, f"summed but not averaged: the gradients are {divisor:g} times too large (each rank's "
                      f"gradient is a sum over its samples; divide the all-reduced sum by {by})"),
            (ranks, f"averaged over the per-rank batch ({per:g}) instead of the global batch ({batch}): the "
                    f"gradients are {ranks} (the number of ranks) times too large"),
            (divisor / ranks, f"divided by the number of ranks ({ranks}), but each rank's gradient is a sum over its "
                              f"{per:g} samples: the gradients are {divisor / ranks:g} times too large; divide by {by}"),
            (1 / ranks, f"divided by {'the global batch' if outputs == 1 else 'B x outputs'} and again by the number "
                        f"of ranks: the gradients are {ranks} times too small"),
        ]
        if outputs > 1:
            wrong.append((outputs, f"divided by the global batch B = {batch} but not by the {outputs} outputs: the "
                                   f"loss is the mean over all B x {outputs} values (as PyTorch's MSELoss), so the "
                                   f"gradients are {outputs} times too large; divide by {divisor}"))
        return wrong
    return [
        (ranks, f"summed but not averaged: the gradients are {ranks} (the number of ranks) times too large (each "
                f"rank's gradient is already a mean over its own samples; divide the all-reduced sum by N = {ranks})"),
        (1 / per, f"divided by the global batch ({batch}), but each rank's gradient is already averaged over its "
                  f"per-rank batch ({per:g}): the gradients are {per:g} times too small; divide by the number of "
                  f"ranks N = {ranks}"),
        (1 / ranks, f"divided by the number of ranks twice: the gradients are {ranks} times too small"),
    ]


def _factor(got: np.ndarray, want: np.ndarray, rtol: float = 1e-6) -> float | None:
    """c if got == c * want (to rounding), else None."""
    norm = float(want @ want)
    c = float(got @ want) / norm if norm else 0.0
    if c != 0 and np.allclose(got, c * want, rtol=rtol, atol=rtol * abs(c) * np.abs(want).max()):
        return c
    return None


def close(a: np.ndarray, b: np.ndarray, rtol: float = 1e-9) -> bool:
    """a equals b to ``rtol`` relative to b's largest value, in shape too (the notebooks' checks share it)."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=rtol * float(np.abs(b).max(initial=0.0))))


def gradients(per_rank, reference, global_batch: int, local: str = "sum",
              local_grads=None, rtol: float = 1e-6, quiet: bool = False, outputs: int = 1) -> Verdict:
    """Check each rank's averaged flat gradient (``per_rank``, rank order) against ``reference``, the mean
    gradient over the global batch flattened in the model's order (W0, b0, W1, b1, ...). ``local_grads``
    (optional): each rank's flat gradient before averaging, to recognise a missing all-reduce. ``outputs``:
    the values per sample that the loss's mean also runs over (2 for notebook 07's MSE; 1: a mean per sample)."""
    return _say(_gradients(per_rank, reference, global_batch, local, local_grads, rtol, outputs), quiet)


def _gradients(per_rank, reference, global_batch, local, local_grads, rtol, outputs=1) -> Verdict:
    if local not in LOCAL:
        raise ValueError(f"local must be one of {LOCAL}, not {local!r}")
    ref = np.asarray(reference, dtype=np.float64).ravel()
    ranks = len(per_rank)
    got = []
    for r, g in enumerate(per_rank):
        if g is None:
            return Verdict(False, f"rank {r} returned nothing: return the averaged gradient (a flat array) on "
                                  "every rank")
        got.append(np.asarray(g, dtype=np.float64).ravel())
        if got[-1].size != ref.size:
            return Verdict(False, f"rank {r} returned {got[-1].size} values but the model has {ref.size} "
                                  "parameters: the bucket must hold every layer's W and b, flattened, once each")

    # 1. Every rank must hold the same numbers, or the replicas part ways.
    odd = [r for r in range(1, ranks) if not np.array_equal(got[r], got[0])]
    if odd:
        why = "every rank must take part in the same all-reduce of the whole bucket and divide by the same number"
        if local_grads is not None:
            mine = [np.asarray(x, dtype=np.float64).ravel() for x in local_grads]
            if all(_factor(g, m, rtol) is not None for g, m in zip(got, mine)):
                why = ("each rank kept its own gradient: the all-reduce is missing (or its result was not used), "
                       "so each replica learns from its own shard only")
            elif close(got[0], ref, rtol) and all(_factor(g, m, rtol) is not None for g, m in zip(got[1:], mine[1:])):
                why = "only rank 0 has the averaged gradient: a reduce (to rank 0) where an all-reduce was needed"
        return Verdict(False, f"replicas diverged: rank {odd[0]} holds a different averaged gradient from rank 0 "
                              f"(largest difference {float(np.abs(got[odd[0]] - got[0]).max()):.3g}), so after "
                              f"the update their weights differ; {why}")

    # 2. The same on every rank: compare with the single-GPU gradient.
    mine = got[0]
    if close(mine, ref, rtol):
        return Verdict(True, f"every rank holds the mean gradient over the global batch of {global_batch} "
                             f"({ref.size} values, identical on all {ranks} ranks): exactly what one GPU computes "
                             "on the whole batch")
    c = _factor(mine, ref, rtol)
    if c is not None:
        hits = [text for factor, text in _mistakes(local, global_batch, ranks, outputs)
                if np.isclose(c, factor, rtol=1e-6)]
        divide = ("the number of ranks" if local == "mean" else "the global batch" if outputs == 1 else
                  f"the global batch times the {outputs} outputs")
        return Verdict(False, " -- or -- ".join(hits) or (
            f"the gradients are {c:.6g} times the right ones: all-reduce with op sum, then divide by {divide}"))
    if close(np.sort(mine), np.sort(ref), rtol):
        return Verdict(False, "the right values in the wrong places: flatten (and unflatten) in the model's order "
                              "W0, b0, W1, b1, ... with each array in row-major (C) order")
    i = int(np.argmax(np.abs(mine - ref)))
    return Verdict(False, f"element {i} is {mine[i]:.6g} but the single-GPU gradient on the global batch has "
                          f"{ref[i]:.6g}: did every rank compute its gradient on its own shard, and were the shards' "
                          "gradients summed (op sum) before dividing?")


def replicas(per_rank_weights, reference=None, rtol: float = 1e-9, quiet: bool = False) -> Verdict:
    """Are all replicas' weights bit-identical, and (optionally) equal to single-GPU training?"""
    weights = [np.asarray(w).ravel() for w in per_rank_weights]
    w0 = weights[0]
    odd = [r for r, w in enumerate(weights) if w.shape != w0.shape or not np.array_equal(w, w0)]
    if odd:
        w = weights[odd[0]]
        detail = (f"it has {w.size} weights, rank 0 has {w0.size}" if w.shape != w0.shape else
                  f"first at weight {int(np.flatnonzero(w != w0)[0])}, "
                  f"largest difference {float(np.abs(w - w0).max()):.3g}")
        return _say(Verdict(False, f"replicas diverged: rank {odd[0]}'s weights differ from rank 0's ({detail}); "
                                   "the ranks did not all apply the same averaged gradient (or did not start from "
                                   "the same broadcast weights)"), quiet)
    msg = f"all {len(weights)} replicas hold identical weights"
    if reference is not None:
        ref = np.asarray(reference).ravel()
        if not close(w0, ref, rtol):
            diff = float(np.abs(w0 - ref).max()) if ref.shape == w0.shape else float("nan")
            return _say(Verdict(False, f"{msg}, but they differ from single-GPU training on the same global "
                                       f"batches (largest difference {diff:.3g}): the averaged gradient is not "
                                       "the mean over the global batch (check the division)"), quiet)
        msg += ", equal to single-GPU training on the same global batches"
    return _say(Verdict(True, msg), quiet)


def losses(n_ranks, one_rank, rtol: float = 1e-4, quiet: bool = False) -> Verdict:
    """Compare a loss trajectory on n ranks with the one on a single rank."""
    many, one = np.asarray(n_ranks, dtype=np.float64), np.asarray(one_rank, dtype=np.float64)
    if many.size != one.size:
        return _say(Verdict(False, f"{many.size} steps on n ranks but {one.size} on one: with the same global "
                                   "batch both take the same steps per epoch (holding the per-rank batch fixed "
                                   "instead makes the global batch, and so the number of steps, change)"), quiet)
    if not np.isfinite(many).all():
        return _say(Verdict(False, "the n-rank losses contain NaN or inf: training diverged"), quiet)
    rel = np.abs(many - one) / np.maximum(np.abs(one), 1e-300)
    if (rel <= rtol).all():
        return _say(Verdict(True, f"the {one.size} losses agree to {rel.max():.1e} relative (tolerance {rtol:g}): "
                                  "n ranks with the same global batch train exactly like one GPU"), quiet)
    s = int(np.argmax(rel > rtol))
    return _say(Verdict(False, f"the trajectories part at step {s + 1}: {many[s]:.6g} on n ranks, {one[s]:.6g} on "
                               f"one (relative difference {rel[s]:.2g}); the same samples per step and the mean "
                               "gradient over the global batch make them equal"), quiet)
