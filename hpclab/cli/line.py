"""One line of a pre-flight (``hpclab doctor``, ``hpclab doctor --site``): a status, what was checked, what
was found and the fix."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Line:
    status: str     # PASS, WARN, FAIL or SKIP
    what: str
    found: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.status:<4}  {self.what}: {self.found}" + (f"  -> fix: {self.fix}" if self.fix else "")
