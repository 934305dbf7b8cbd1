"""Refuse, before it starts, work that could not finish in a day or fit in memory.

``--samples 1e18`` parses as a fine number, then runs until killed; ``--n 1e6`` asks for terabytes. A
program's input check estimates what its arguments cost and calls :func:`refuse_long` / :func:`refuse_large`.
Time estimates are lower bounds, the work over a rate per rank (:data:`FASTEST`) several times what
hpclab has measured: a refused run could not have finished anyway.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpclab.options import UsageError

MAX_SECONDS = 24 * 3600

# Per rank and second, faster than anything measured: on a GPU, over 2x the H200 figures in
# docs/results.md (8.2e11 samples/s, 2.1e12 bins/s, 67 TFLOP/s FP32 peak, a launch in ~5 us); on
# the simulator (one Python thread per CUDA thread) several times what it does on a CI-class
# CPU (4.5e4 samples/s, 1.6e5 bins/s, 7e5 FLOP/s in the naive matmul, ~1e-2 s per launch).
FASTEST = {
    "gpu": {"samples": 2e12, "bins": 5e12, "flops": 2e15, "launch_s": 2e-6},
    "sim": {"samples": 3e5, "bins": 2e6, "flops": 2e6, "launch_s": 1e-3},
}


@dataclass(frozen=True)
class Launch:
    """Where a program is about to run: what its input check may depend on."""

    ranks: int = 1
    ranks_per_node: int = 1
    backend: str = "sim"            # "gpu" or "sim"
    memory: float | None = None     # bytes available on a node; None: ask this node

    def fastest(self, what: str) -> float:
        return FASTEST[self.backend][what]

    def node_bytes(self, first: float, other: float) -> float:
        """Memory of the ranks on one node: rank 0's share and the others'."""
        return first + (self.ranks_per_node - 1) * other


def require_share(option: str, value: int, shares: int, what: str) -> None:
    """Every rank (or GPU) needs at least one of ``value`` items: name the option if not."""
    from hpclab.decomp import require_at_least

    try:
        require_at_least(value, shares, what)
    except ValueError as exc:
        raise UsageError(f"{option} {shown(value)}: {exc}") from None


def duration(seconds: float) -> str:
    """3.2 days, 1 hour, 5 s."""
    for unit, length in (("year", 365 * 86400), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length:
            value = seconds / length
            return f"{value:.3g} {unit}{'' if f'{value:.3g}' == '1' else 's'}"
    return f"{seconds:.3g} s"


def shown(value) -> str:
    """A count as given on a command line: 1024, or 1e+18 rather than nineteen digits."""
    return f"{value:.3g}" if isinstance(value, (int, float)) and abs(value) >= 10 ** 7 else str(value)


def size(nbytes: float) -> str:
    for unit, length in (("EiB", 2 ** 60), ("PiB", 2 ** 50), ("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if nbytes >= length:
            return f"{nbytes / length:.3g} {unit}"
    return f"{nbytes:.0f} bytes"


def refuse_long(option: str, value, seconds: float, how: str, fix: str | None = None) -> None:
    """Raise if the work of ``option value`` needs more than MAX_SECONDS at the fastest rate."""
    if seconds > MAX_SECONDS:
        raise UsageError(
            f"{option} {shown(value)} would run for at least {duration(seconds)} ({how}); the limit is "
            f"{duration(MAX_SECONDS)}: {fix or f'use a smaller {option}'}, or split the work into several runs")


def memory_available() -> int:
    """Bytes this process could still allocate on its node: psutil's available memory, or what a container's
    or a Slurm job's cgroup limit leaves, if less (psutil does not read cgroup limits)."""
    import psutil

    found = [psutil.virtual_memory().available]
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(max(0, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())))
    except (OSError, ValueError):
        pass
    return min(found)


def refuse_large(option: str, value, nbytes: float, what: str, available: float | None = None) -> None:
    """Raise if ``option value`` needs more host memory on this node than ``available`` bytes (None: ask)."""
    available = memory_available() if available is None else available
    if nbytes > available:
        raise UsageError(
            f"{option} {shown(value)} needs about {size(nbytes)} of memory ({what}), but this node has "
            f"{size(available)} available: use a smaller {option}")
