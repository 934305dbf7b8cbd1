"""Notebook 08's checks: ZeRO-1's step (the exercise) and the two tensor-parallel splits, said in words."""
from __future__ import annotations

import numpy as np

from hpclab.ddp.check import close
from hpclab.verdict import Verdict, say


def _shards(v, n: int) -> np.ndarray:
    """A vector padded with zeros to a multiple of n, as n shards (rows)."""
    return np.concatenate([v, np.zeros(-v.size % n)]).reshape(n, -1)


def zero_step(shards, weights, mean_grad, stepped, quiet: bool = False) -> Verdict:
    """Each rank's shard of the mean gradient after the reduce-scatter and its weights after the all-gather (rank
    order), against the mean gradient over the global batch and one Adam step with it, both from one process."""
    grad, stepped = np.ravel(mean_grad), np.ravel(stepped)
    n, p = len(shards), grad.size
    want, mine = _shards(grad, n), _shards(stepped, n)
    size = want.shape[1]
    for r, g in enumerate(np.ravel(g).astype(float) for g in shards):
        if g.size != size:
            return say(Verdict(False, f"rank {r} holds {g.size} gradient values, a shard is {size}: " + (
                "a reduce-scatter leaves each rank its own shard (an all-reduce gives every rank all)" if g.size >= p
                else f"pad the {p} parameters with zeros to {n * size}, a multiple of {n} ranks")), quiet)
        if not close(g, want[r]):
            why = (f"it is {n} times the mean: the reduce-scatter sums the ranks' gradients, each a mean over its own "
                   f"rows; divide the sum by the {n} ranks" if close(g, n * want[r]) else
                   f"largest difference {np.abs(g - want[r]).max():.3g}: reduce-scatter the padded bucket (op sum)")
            return say(Verdict(False, f"rank {r}'s shard is not shard {r} of the mean gradient: {why}"), quiet)
    for r, w in enumerate(np.ravel(w).astype(float) for w in weights):
        if w.size != p:
            return say(Verdict(False, f"rank {r} holds {w.size} weights, the model {p}: after the all-gather keep "
                                      f"the first {p} values (the rest is padding)"), quiet)
        if not close(w, stepped):
            got = _shards(w, n)
            moved = [(i, q) for i in range(n - 1) for q in range(n) if q != i and close(got[i], mine[q])]
            why = (f"shard {moved[0][1]} lies where shard {moved[0][0]} belongs: the all-gather returns the shards in "
                   "rank order; keep it" if moved else "only its own shard holds the new weights: all-gather the "
                   "updated shards into the weights" if close(got[r], mine[r]) else "update your shard with Adam, "
                   "from your shard of the mean gradient and your shard's moments")
            return say(Verdict(False, f"rank {r}'s weights are not one Adam step on the mean gradient: {why}"), quiet)
    return say(Verdict(True, f"each of the {n} ranks holds its shard of the mean gradient ({size} values) and, after "
                             f"the all-gather, the {p} weights of one Adam step on the whole vector"), quiet)


def bound(x, w) -> np.ndarray:
    """How far x @ w computed in x's dtype may be from the exact product, element by element, whatever the order
    of its sums: gamma_K (|x| @ |w|), gamma_K = K u / (1 - K u), u the unit roundoff (Higham 2002, chapter 3)."""
    gamma = x.shape[1] * np.finfo(x.dtype).eps / 2
    return gamma / (1 - gamma) * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))


def tensor_split(per_rank, x, w, by: str, quiet: bool = False) -> Verdict:
    """Each rank's Y from the split ``by`` "columns" or "rows" against X @ W, within :func:`bound`."""
    x, w, n = np.asarray(x), np.asarray(w), len(per_rank)
    want, tol = x.astype(np.float64) @ w.astype(np.float64), bound(x, w)
    (batch, out), k = want.shape, (w.shape[1] if by == "columns" else w.shape[0]) // n
    for r, y in enumerate(np.asarray(y, dtype=np.float64) for y in per_rank):
        mine = slice(r * k, (r + 1) * k)
        if y.shape == want.shape and (np.abs(y - want) <= tol).all():
            continue
        if by == "columns" and (y.shape == (n * batch, k) or close(
                y, np.concatenate(np.split(want, n, axis=1)).reshape(batch, out), 1e-4)):
            why = ("the all-gather stacks the slices along the first axis, but each is a block of Y's columns: put "
                   f"them side by side, np.concatenate(np.split(gathered, {n}), axis=1)")
        elif by == "rows" and close(y, x[:, mine].astype(np.float64) @ w[mine], 1e-4):
            why = "it is this rank's partial product only: sum the partials over the ranks (all-reduce, op sum)"
        elif y.shape != want.shape:
            why = f"it is {' x '.join(map(str, y.shape))}, X @ W is {batch} x {out}"
        else:
            why = f"largest difference {np.abs(y - want).max():.3g}, beyond the rounding bound {tol.max():.2g}"
        return say(Verdict(False, f"rank {r}'s Y is not X @ W: {why}"), quiet)
    worst = max(float((np.abs(np.asarray(y) - want) / np.maximum(tol, 1e-300)).max()) for y in per_rank)
    return say(Verdict(True, f"split by {by}, all {n} ranks hold Y = X @ W ({batch} x {out}), the largest difference "
                             f"{worst:.2g} of the rounding bound"), quiet)
