"""What a pi answer may be off by (the midpoint rule's error bound, the Monte Carlo standard error,
the limit on bins), and the exercise checks that tell a learner what a wrong answer most likely
did. No Numba: the programs check their input with it before any kernel loads."""
from __future__ import annotations

import math

import numpy as np

from hpclab.decomp import block_range
from hpclab.pi.philox import count_hits_reference
from hpclab.speedup import speedups as reference_speedups
from hpclab.verdict import Verdict, say as _say

MAX_BINS = (1 << 52) - 1     # bin midpoints (i + 1/2) are exact in float64 below 2^52
P_INSIDE = math.pi / 4       # the chance that a sample falls inside the quarter circle


def truncation_bound(bins: int) -> float:
    """The midpoint rule's error bound (b-a) h^2 max|f''| / 24 = h^2 / 3 for f = 4/(1+x^2) on [0, 1]."""
    return 8.0 / (24.0 * bins * bins)


def midpoint_bound(bins: int, blocks: int, threads: int, ranks: int) -> float:
    """|computed - pi| allowed for ``bins`` bins summed by ``ranks`` launches of blocks x threads: the h^2
    bound plus float64 rounding. Recursive summation of n terms errs by at most about n u pi (u = 2^-53),
    n the longest chain of roundings (a thread's own terms, each with a few roundings, the block's tree,
    the blocks' atomics, the ranks' reduction), doubled for safety; plus the rounding of math.pi."""
    share = -(-bins // ranks)                       # the largest rank's bins
    terms = -(-share // (blocks * threads))         # the longest thread's terms
    chain = terms + 16 + math.log2(threads) + blocks + ranks
    u = 2.0 ** -53
    return truncation_bound(bins) + 2.0 * u * math.pi * chain + u * math.pi


def standard_error(samples: int) -> float:
    """Standard error of 4 hits / N: 4 sqrt(p (1 - p) / N), p = pi / 4."""
    return 4.0 * math.sqrt(P_INSIDE * (1.0 - P_INSIDE) / samples)


def estimate(hits: int, samples: int) -> dict:
    """pi = 4 hits / samples, its error, and the binomial standard error sigma (a correct counter
    misses pi by more than five sigma with probability below 1e-6)."""
    pi_hat, sigma = 4.0 * hits / samples, standard_error(samples)
    error = abs(pi_hat - math.pi)
    return {"pi": pi_hat, "abs_error": error, "sigma": sigma, "within_5_sigma": error <= 5 * sigma}


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
    """The midpoint estimate against its error bound h^2/3 plus float64 rounding, which grows with the
    bins each thread adds up: give the launch shape (blocks, threads per block) for a tight check."""
    h = 1.0 / bins
    err = abs(computed - math.pi)
    bound = midpoint_bound(bins, blocks, threads, ranks)
    if err <= bound:
        return _say(Verdict(True, f"pi = {computed:.15f}, error {err:.3e} <= bound {bound:.3e} "
                                  f"(h^2/12 = {h * h / 12:.3e} is the expected size)"), quiet)
    return _say(Verdict(False, f"pi = {computed:.15f} is {err:.3e} from pi, more than the bound {bound:.3e}; "
                               f"{_midpoint_hint(computed, bins)}"), quiet)


def _midpoint_hint(computed: float, bins: int) -> str:
    """What a wrong midpoint sum most likely did, from the size and sign of its error in units of h."""
    h = 1.0 / bins
    if abs(computed * h - math.pi) < 1e-3 * math.pi:
        return f"the result is about N x pi (N = {bins}): multiply the sum by the bin width h = 1/N"
    if abs(computed / h - math.pi) < 1e-3 * math.pi:
        return "the result is about h x pi: the bin width h is applied twice (once is enough)"
    in_h = (computed - math.pi) / h
    # A rule that evaluates f at one end of each bin is off by h (f(0) - f(1)) / 2 = h, to O(h^2).
    if abs(in_h - 1) < 0.05:
        return (f"the error is {in_h:+.3f} h, the signature of the left-endpoint rule: x = i*h evaluates f "
                "at the left end of each bin; the midpoint is x = (i + 0.5) * h")
    if abs(in_h + 1) < 0.05:
        return (f"the error is {in_h:+.3f} h, the signature of the right-endpoint rule: x = (i + 1)*h "
                "evaluates f at the right end of each bin; the midpoint is x = (i + 0.5) * h")
    if abs(in_h) > 0.5:
        what = "counted twice" if in_h > 0 else "lost"
        return (f"the error is {in_h:+.2f} h, a few bins' worth (each bin adds h f(x), between 2h and 4h): "
                f"bins are {what}; check the slice ends and the loop bounds (start + t up to start + count, "
                "step stride)")
    return "check the midpoints (i + 1/2) h and the factor h"


def monte_carlo(hits: int, samples: int, seed: int | None = None, quiet: bool = False) -> Verdict:
    """Hits against the exact count of the counter-based generator (small runs) or 5 standard errors."""
    e = estimate(hits, samples)
    z = e["abs_error"] / e["sigma"]
    if seed is not None and samples <= 2_000_000:
        exact = count_hits_reference(0, samples, seed)
        if hits == exact:
            return _say(Verdict(True, f"{hits} hits of {samples}: exactly the generator's count; "
                                      f"pi ~ {e['pi']:.6f}, {z:.2f} standard errors off"), quiet)
        return _say(Verdict(False, f"{hits} hits, but samples 0..{samples - 1} of seed {seed} give {exact}: "
                                   "some samples are missing or repeated "
                                   "(each rank must count exactly its own slice, each sample once)"), quiet)
    ok = z <= 5
    return _say(Verdict(ok, f"pi ~ {e['pi']:.8f}, {z:.2f} standard errors (sigma = {e['sigma']:.2e}) from pi"
                            + ("" if ok else ": beyond 5 sigma, samples are lost, repeated or correlated")), quiet)


def hit_count(hits: int, expected: int, samples: int, ranks: int = 1, seed: int | None = None,
              quiet: bool = False) -> Verdict:
    """A hand-written hit-counting kernel's total against ``expected``, the library's count of the same
    samples; with ``seed`` and a small ``samples`` the common slips are recognised by recounting on the host."""
    hits, expected = int(hits), int(expected)
    if hits == expected:
        return _say(Verdict(True, f"{hits} hits of {samples} samples on {ranks} ranks: exactly the library's "
                                  f"count, pi ~ {4 * hits / samples:.6f}"), quiet)
    head = f"{hits} hits, the library counts {expected} for the same {samples} samples"
    if hits == 0:
        return _say(Verdict(False, f"{head}: your kernel counted none. For each of the thread's indices i, add 1 "
                                   "to hits when mc.sample_inside(seed, i) is true"), quiet)
    if seed is not None and samples <= 2_000_000:
        shares = [block_range(samples, ranks, r) for r in range(ranks)]
        if hits == sum(count_hits_reference(0, b - a, seed) for a, b in shares):
            return _say(Verdict(False, f"{head}: every rank counted samples 0, 1, 2, ... instead of its own "
                                       "slice; start the loop at start + t (start is the rank's first sample)"),
                        quiet)
    if hits > samples:
        return _say(Verdict(False, f"{head}: more hits than samples, so samples were counted more than once. "
                                   "Step the loop by stride = cuda.gridsize(1): range(start + t, start + count, "
                                   "stride) gives each thread every stride-th sample"), quiet)
    if hits > expected:
        return _say(Verdict(False, f"{head}: {hits - expected} too many, so some samples were counted twice; "
                                   "check the loop's step (stride) and its end (start + count)"), quiet)
    return _say(Verdict(False, f"{head}: {expected - hits} too few, so some samples were skipped; the loop "
                               "must run from start + t to start + count in steps of stride"), quiet)


def same_estimate(by_ranks: dict[int, float], quiet: bool = False) -> Verdict:
    """The estimate must not depend on the number of ranks."""
    values = set(by_ranks.values())
    if len(values) == 1:
        return _say(Verdict(True, f"the same estimate {values.pop()!r} on {sorted(by_ranks)} ranks"), quiet)
    return _say(Verdict(False, f"the estimate changes with the ranks: {by_ranks}; derive each sample from its "
                               "global index, not from the rank"), quiet)


def samples_for(fn, quiet: bool = False) -> Verdict:
    """The 1/sqrt(N) exercise: ``fn(target)`` must give the fewest samples whose standard error is at most target."""
    for target in (1e-2, 1e-3, 1e-5):
        n, need = fn(target), math.ceil((standard_error(1) / target) ** 2)
        if not isinstance(n, (int, np.integer)) or n < 1 or standard_error(n) > target * (1 + 1e-12):
            why = f"its standard error must be at most {target:g}, and sigma falls only as 1/sqrt(N)"
        elif n > need * 1.01 + 1:
            why = f"{need:,} samples already reach {target:g}: solve 4 sqrt(p (1 - p) / N) = target for N"
        else:
            continue
        return _say(Verdict(False, f"samples_for({target:g}) returned {n!r}: {why}"), quiet)
    return _say(Verdict(True, f"right: {fn(1e-3):,} samples for 1e-3, a hundred times more for a tenth of it"), quiet)


def speedups(fn, times: dict, quiet: bool = False) -> Verdict:
    """The scaling exercise: ``fn(times)`` maps {gpus: seconds} to {gpus: (speedup, efficiency)}."""
    ranks = sorted(times)
    want, got = dict(zip(ranks, reference_speedups(ranks, [times[n] for n in ranks]))), fn(dict(times))
    for n in ranks:
        (s, e), mine = want[n], (got.get(n) if isinstance(got, dict) else None) or (None, None)
        if mine[0] is None or not math.isclose(mine[0], s, rel_tol=1e-9):
            why = "you divided the other way round" if mine[0] and math.isclose(mine[0], 1 / s) else "it is T(1) / T(n)"
            return _say(Verdict(False, f"the speedup on {n} GPUs is not {mine[0]!r}: {why}"), quiet)
        if not math.isclose(mine[1], e, rel_tol=1e-9):
            return _say(Verdict(False, f"the efficiency on {n} GPUs is not {mine[1]!r}: the speedup per GPU"), quiet)
    s, e = want[ranks[-1]]
    return _say(Verdict(True, f"right: on {ranks[-1]} GPUs speedup {s:.3f}, efficiency {e:.4f}"), quiet)
