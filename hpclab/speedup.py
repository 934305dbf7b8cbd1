"""Speedup, efficiency and the serial fraction of a scaling sweep: the one place they are computed.

Strong: S(n) = T(1)/T(n), E(n) = S(n)/n, Amdahl's S(n) = 1 / (f + (1 - f)/n).
Weak: E(n) = T(1)/T(n), scaled speedup n E(n), Gustafson's n E(n) = n - f (n - 1).
"""
from __future__ import annotations

import numpy as np


def speedups(ranks: list[int], seconds: list[float], mode: str = "strong") -> list[tuple[float, float]]:
    """(speedup, efficiency) at each rank count, relative to the first (the fewest ranks), which
    counts as perfectly efficient: strong S(n) = T(b) b / T(n), E = S/n; weak E(n) = T(b) / T(n), S = n E."""
    b, t_b = ranks[0], seconds[0]
    if mode == "strong":
        return [(t_b * b / t, t_b * b / t / n) for n, t in zip(ranks, seconds)]
    return [(n * t_b / t, t_b / t) for n, t in zip(ranks, seconds)]


def serial_fraction(ranks: list[int], speedups: list[float], mode: str = "strong") -> float:
    """Least-squares serial fraction, clipped to [0, 1] (nan with fewer than two rank counts). Strong
    (Amdahl): 1/S - 1/n = f (1 - 1/n); weak (Gustafson): n - S = f (n - 1); both a = f b through the origin."""
    n, s = np.array([(n, s) for n, s in zip(ranks, speedups) if n > 1 and s > 0], float).reshape(-1, 2).T
    if not n.size:
        return float("nan")
    a, b = (1 - 1 / n, 1 / s - 1 / n) if mode == "strong" else (n - 1, n - s)
    return float(np.clip(a @ b / (a @ a), 0.0, 1.0))


def amdahl_speedup(n: float, f: float) -> float:
    return 1.0 / (f + (1.0 - f) / n)
