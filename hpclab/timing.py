"""Timing that means something on many ranks and on a GPU: ``wall`` (the job is as slow as its
slowest rank), ``Phases`` (time per named phase), ``median_time(s)`` (after a warm-up: Numba
compiles on first call)."""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

from hpclab import backend
from hpclab.mpi import world


def _sync() -> None:
    backend.cuda().synchronize()


def wall(fn, comm=None, sync: bool = True):
    """Run ``fn()`` on every rank between a barrier and MPI.Wtime (the device synchronised before the
    clock is read); return (result, this rank's seconds, max over ranks)."""
    comm = comm or world()
    from mpi4py import MPI

    comm.Barrier()
    t0 = MPI.Wtime()
    result = fn()
    if sync:
        _sync()
    local = MPI.Wtime() - t0
    return result, local, comm.allreduce(local, op=MPI.MAX)


def timed(fn):
    """(fn(), seconds by MPI.Wtime) on this rank alone: no barrier, no device sync."""
    from mpi4py import MPI

    t0 = MPI.Wtime()
    value = fn()
    return value, MPI.Wtime() - t0


class Phases:
    """Named time accumulators: ``with phases("compute"): ...``."""

    def __init__(self, sync: bool = True):
        self.seconds: dict[str, float] = defaultdict(float)
        self.sync = sync

    @contextmanager
    def __call__(self, name: str):
        if self.sync:
            _sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                _sync()
            self.seconds[name] += time.perf_counter() - t0

    def max_over_ranks(self, comm=None) -> dict[str, float]:
        from mpi4py import MPI

        comm = comm or world()
        names = sorted(set().union(*comm.allgather(set(self.seconds))))
        return {n: comm.allreduce(self.seconds.get(n, 0.0), op=MPI.MAX) for n in names}


def median_times(*fns, repeats: int = 5, warmup: int = 1, sync: bool = True) -> list[float]:
    """Median wall seconds of each of ``fns`` over ``repeats`` after ``warmup`` calls, timed in
    turns (f, g, f, g, ...): compared functions see the same clocks and temperature, so their
    ratio does not drift with the GPU's state."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    if sync:
        _sync()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            if sync:
                _sync()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def median_time(fn, repeats: int = 5, warmup: int = 1, sync: bool = True) -> float:
    return median_times(fn, repeats=repeats, warmup=warmup, sync=sync)[0]
