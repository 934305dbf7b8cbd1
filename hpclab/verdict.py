"""Answer checks for exercises: each returns a :class:`Verdict` (truthy when right) and prints it, so a
notebook cell ending in a check says in words whether the answer is right and why not. One module per
topic: ``hpclab.collectives.check``, ...
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Verdict:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return ("correct: " if self.ok else "not yet: ") + self.message

    def _repr_markdown_(self) -> str:
        return ("✅ " if self.ok else "❌ ") + self.message


def say(verdict: Verdict, quiet: bool = False) -> Verdict:
    """Print the verdict unless quiet; return it."""
    if not quiet:
        print(verdict)
    return verdict
