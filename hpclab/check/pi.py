"""Checks for the pi exercises (midpoint rule and Monte Carlo), grounded in theory."""
from __future__ import annotations

import math

from . import Verdict, say as _say


def slices(my_slice, quiet: bool = False) -> Verdict:
    """``my_slice(n, size, rank) -> (start, stop)``: contiguous, covering, shares differing by at most one."""
    for n, size in [(10, 3), (1001, 4), (7, 7), (5, 1), (10**12 + 3, 4)]:
        got = [tuple(int(v) for v in my_slice(n, size, r)) for r in range(size)]
        if got[0][0] != 0 or got[-1][1] != n:
            return _say(Verdict(False, f"for {n} items on {size} ranks the slices run from {got[0][0]} to "
                                       f"{got[-1][1]}, not from 0 to {n}: {got}"), quiet)
        for r in range(1, size):
            if got[r][0] != got[r - 1][1]:
                return _say(Verdict(False, f"for {n} items on {size} ranks, rank {r - 1} stops at {got[r - 1][1]} "
                                           f"but rank {r} starts at {got[r][0]}: items are lost or counted twice"),
                            quiet)
        shares = [b - a for a, b in got]
        if max(shares) - min(shares) > 1:
            return _say(Verdict(False, f"for {n} items on {size} ranks the shares are {shares}: spread the "
                                       f"remainder {n % size} over the first ranks, one each"), quiet)
    return _say(Verdict(True, "slices are contiguous, cover every item once and differ by at most one"), quiet)


def midpoint(computed: float, bins: int, ranks: int = 1, blocks: int = 1, threads: int = 1,
             quiet: bool = False) -> Verdict:
    """The midpoint estimate against its error bound h^2/3 plus float64 rounding.

    The rounding allowance grows with the bins each thread adds up: give the
    launch shape (blocks, threads per block) for a tight check.
    """
    from ..programs.pi_midpoint import error_bound

    h = 1.0 / bins
    err = abs(computed - math.pi)
    bound = error_bound(bins, blocks, threads, ranks)
    if err <= bound:
        return _say(Verdict(True, f"pi = {computed:.15f}, error {err:.3e} <= bound {bound:.3e} "
                                  f"(h^2/12 = {h * h / 12:.3e} is the expected size)"), quiet)
    hint = ("about h x f(x) of one bin: a bin is lost or counted twice (check the slice ends and the "
            "loop bounds)" if err > 0.5 * h else "check the midpoints (i + 1/2) h and the factor h")
    return _say(Verdict(False, f"pi = {computed:.15f} is {err:.3e} from pi, more than the bound {bound:.3e}; "
                               f"the error is {hint}"), quiet)


def monte_carlo(hits: int, samples: int, seed: int | None = None, quiet: bool = False) -> Verdict:
    """Hits against the exact count of the counter-based generator (small runs) or 5 standard errors."""
    from ..kernels import pi as k

    pi_hat = 4.0 * hits / samples
    sigma = k.mc_standard_error(samples)
    if seed is not None and samples <= 2_000_000:
        exact = k.count_hits_reference(0, samples, seed)
        if hits == exact:
            return _say(Verdict(True, f"{hits} hits of {samples}: exactly the generator's count; "
                                      f"pi ~ {pi_hat:.6f}, {abs(pi_hat - math.pi) / sigma:.2f} standard errors off"),
                        quiet)
        return _say(Verdict(False, f"{hits} hits, but samples 0..{samples - 1} of seed {seed} give {exact}: "
                                   f"{'some samples are missing or repeated' if abs(hits - exact) > 0 else ''} "
                                   "(each rank must count exactly its own slice, each sample once)"), quiet)
    z = abs(pi_hat - math.pi) / sigma
    ok = z <= 5
    return _say(Verdict(ok, f"pi ~ {pi_hat:.8f}, {z:.2f} standard errors (sigma = {sigma:.2e}) from pi"
                            + ("" if ok else ": beyond 5 sigma, samples are lost, repeated or correlated")), quiet)


def same_estimate(by_ranks: dict[int, float], quiet: bool = False) -> Verdict:
    """The estimate must not depend on the number of ranks."""
    values = set(by_ranks.values())
    if len(values) == 1:
        return _say(Verdict(True, f"the same estimate {values.pop()!r} on {sorted(by_ranks)} ranks"), quiet)
    return _say(Verdict(False, f"the estimate changes with the ranks: {by_ranks}; derive each sample from its "
                               "global index, not from the rank"), quiet)
