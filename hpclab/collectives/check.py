"""Exercise 0 and the hand-written ring all-reduce."""
from __future__ import annotations

import numpy as np

from hpclab.collectives.ring import ring_bytes_per_rank
from hpclab.verdict import Verdict, say as _say


def exercise0_expected(n: int) -> dict[str, list[list[float]]]:
    """The slides' answers, generalised from 4 GPUs to n: GPU r starts with [r + 1]."""
    values = [[float(r + 1)] for r in range(n)]
    total = float(n * (n + 1) // 2)
    everyone = [float(r + 1) for r in range(n)]
    return {
        "sendrecv": [[float((r - 1) % n + 1)] for r in range(n)],   # ring shift to the right
        "bcast": [[1.0] for _ in range(n)],
        "scatter": [[10.0 * (r + 1)] for r in range(n)],            # root scatters 10, 20, ...
        "gather": [everyone] + values[1:],
        "reduce": [[total]] + values[1:],
        "allreduce": [[total] for _ in range(n)],
        "allgather": [everyone for _ in range(n)],
        "reduce_scatter": [[total * (r + 1)] for r in range(n)],    # rank r gave (r+1)(j+1) to slot j
    }


def format_gpus(per_rank: list[list[float]]) -> str:
    """The slides' notation: GPU0 = [ 1 ], GPU1 = [ 2 ], ..."""
    return ", ".join(f"GPU{r} = [ {', '.join(f'{x:g}' for x in v)} ]" for r, v in enumerate(per_rank))


def _name(name) -> str | None:
    """'Reduce', 'AllReduce', 'all-reduce', 'Reduce_Scatter' -> the answer's key, or None."""
    flat = str(name).lower().replace("-", "").replace("_", "").replace(" ", "").replace("/", "")
    keys = {k.replace("_", ""): k for k in exercise0_expected(1)}
    return keys.get(flat)


def collective(name: str, got: list[list[float]], quiet: bool = False) -> Verdict:
    """Compare what each GPU holds after collective ``name`` (``got``: one list per GPU, ``[[10], [2], [3],
    [4]]``) with the answer; names are matched loosely (``"Reduce"``, ``"AllReduce"``, ``"all-reduce"``)."""
    key = _name(name)
    if key is None:
        return _say(Verdict(False, f"{name!r} is not one of the collectives here: "
                                   f"{', '.join(exercise0_expected(1))}"), quiet)
    name = key
    if not isinstance(got, (list, tuple)) or not all(isinstance(v, (list, tuple, np.ndarray)) for v in got):
        return _say(Verdict(False, f"{name}: give one list per GPU, e.g. [[1], [2], [3], [4]] for four GPUs "
                                   f"holding one value each, not {got!r}"), quiet)
    expected = exercise0_expected(len(got))[name]
    got = [list(map(float, np.ravel(v))) for v in got]
    if got == expected:
        return _say(Verdict(True, f"{name}: {format_gpus(got)}"), quiet)
    wrong = [r for r, (g, e) in enumerate(zip(got, expected)) if g != e]
    return _say(Verdict(False, f"{name}: GPU{wrong[0]} holds {got[wrong[0]]} but should hold "
                               f"{expected[wrong[0]]}; expected {format_gpus(expected)}"), quiet)


PREDICTED = {"reduce": "which GPU receives a Reduce's result, and what do the others hold afterwards?",
             "allreduce": "which GPUs hold the result of an all-reduce?",
             "allgather": "after an all-gather, does a GPU hold one value or all of them, in which order?"}


def predictions(answer, n: int = 4, quiet: bool = False) -> Verdict:
    """The prediction exercise: ``answer`` maps reduce, allreduce and allgather to one list per GPU.
    A wrong or missing entry is named with a hint, never with the right answer."""
    keys = {_name(k): v for k, v in answer.items()} if isinstance(answer, dict) else {}
    if missing := [k for k in PREDICTED if k not in keys]:
        return _say(Verdict(False, f"answer needs the keys {', '.join(map(repr, PREDICTED))}, each a list of one "
                                   f"list per GPU (at the start [[1], [2], [3], [4]]); missing: {', '.join(missing)}"),
                    quiet)
    for name, hint in PREDICTED.items():
        if not isinstance(keys[name], (list, tuple)) or len(keys[name]) != n or not collective(name, keys[name], True):
            return _say(Verdict(False, f"{name}: not what the {n} GPUs hold (one list per GPU). Think again: {hint}"),
                        quiet)
    return _say(Verdict(True, "all three predictions are right: " +
                        "; ".join(f"{k}: {format_gpus(keys[k])}" for k in PREDICTED)), quiet)


def allreduce(result, reference, bytes_sent: int | None = None, nbytes: int | None = None,
              ranks: int | None = None, quiet: bool = False) -> Verdict:
    """A hand-written all-reduce against MPI's, and its traffic against 2(N-1)/N x size."""
    result, reference = np.asarray(result), np.asarray(reference)
    if result.shape != reference.shape:
        return _say(Verdict(False, f"the result has shape {result.shape}, MPI's has {reference.shape}"), quiet)
    if not np.allclose(result, reference, rtol=1e-12, atol=0):
        i = int(np.argmax(np.abs(result - reference)))
        return _say(Verdict(False, f"element {i} is {result.flat[i]}, MPI's Allreduce gives "
                                   f"{reference.flat[i]}: check which chunk each step sends and adds"), quiet)
    msg = "matches MPI's Allreduce"
    if bytes_sent is not None and nbytes and ranks:
        ideal = ring_bytes_per_rank(nbytes, ranks)
        # Uneven chunks may add at most one element per step.
        slack = 2 * (ranks - 1) * result.itemsize
        if abs(bytes_sent - ideal) > slack:
            return _say(Verdict(False, f"sent {bytes_sent} bytes, but a ring sends 2(N-1)/N x size = "
                                       f"{ideal:.0f}: each step should send one chunk of size/N"), quiet)
        msg += f"; sent {bytes_sent} bytes = 2(N-1)/N x {nbytes} (ideal {ideal:.0f})"
    return _say(Verdict(True, msg), quiet)
