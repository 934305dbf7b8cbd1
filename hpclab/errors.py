"""Raise one rank's exception on every rank, instead of leaving the others blocked in a collective (a hang).

Work that can fail goes inside ``with step(comm, "what"):``; its end is one ``allgather`` of outcomes, and
if any rank failed, all raise :class:`RankError` naming the failing ranks and their messages.
"""
from __future__ import annotations

from contextlib import contextmanager

from hpclab.mpi import world


class RankError(RuntimeError):
    """Some rank failed inside a collective step; raised on every rank."""

    def __init__(self, what: str, failures: dict[int, str], size: int):
        self.what, self.failures, self.size = what, failures, size
        ranks = ", ".join(str(r) for r in failures)
        first = next(iter(failures.values()))
        # A nested step's message already says how many other ranks failed; the same
        # message from every failing rank is said once.
        same = len(set(failures.values())) == 1
        others = "" if len(failures) == 1 or same or "(and " in first else f" (and {len(failures) - 1} more)"
        super().__init__(
            f"{what} failed on rank {ranks} of {size}: {first}{others}")


@contextmanager
def step(comm=None, what: str = "collective step"):
    """Run a block on every rank; if it raises anywhere, raise everywhere."""
    comm = comm or world()
    error, own = None, None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - re-raised below on every rank
        own = exc
        error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RankError) else str(exc)
    outcomes = comm.allgather(error)
    failures = {r: msg for r, msg in enumerate(outcomes) if msg is not None}
    if failures:
        raise RankError(what, failures, comm.size) from own
