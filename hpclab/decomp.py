"""Splitting work among ranks: contiguous blocks, remainders spread."""
from __future__ import annotations


def block_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous share of n items: the first ``n % size`` ranks take one extra
    item, so shares differ by at most one, and the union over ranks is exactly range(n)."""
    if size <= 0 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a communicator of size {size}")
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def block_counts(n: int, size: int) -> list[int]:
    """How many items each rank gets (for Scatterv/Gatherv)."""
    return [stop - start for start, stop in (block_range(n, size, r) for r in range(size))]


def require_at_least(n: int, size: int, what: str) -> None:
    """Every rank needs at least one item: say so, with the fix."""
    if n < size:
        raise ValueError(
            f"{n} {what} cannot be shared among {size} ranks (each rank needs at least one); "
            f"use at least {size} {what} or fewer ranks (mpiexec -n {max(n, 1)}).")
