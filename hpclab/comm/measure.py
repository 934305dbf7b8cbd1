"""All-reduce bandwidth and latency per backend, as notebook 05 measures them on the engines (``run``).

Per message size and backend: the median time of the calls after warm-up (each call starts after a barrier;
its time is the slowest rank's), the algorithm bandwidth ``algbw = bytes / time`` and the bus bandwidth
``busbw = algbw * 2(n-1)/n`` (nccl-tests' definition: what each link carries in a ring all-reduce, comparable
across rank counts). Every rank fills its buffer with ``rank + 1``; a row is verified when the result is
``n(n+1)/2`` everywhere. On GPUs with NCCL a raw-NCCL baseline (CuPy arrays, ``cupy.cuda.nccl`` called
directly) is timed in the same job: the ratio of the two is the cost of hpclab's layer
(``python -m benchmarks allreduce`` records it).
"""
from __future__ import annotations

import re
import statistics

import numpy as np

from hpclab import backend
from hpclab.comm import choose, get
from hpclab.comm.nccl import NEEDS_OWN_GPU, destroy_all, require_one_gpu_per_rank, unique_id
from hpclab.comm.nccl import available as nccl_available
from hpclab.device import describe_sharing, sharing
from hpclab.errors import step
from hpclab.mpi import MPI, cuda_aware
from hpclab.options import UsageError
from hpclab.timing import wall

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
RAW = "raw-nccl"


def parse_size(text: str) -> int:
    """'4' -> 4, '1K' -> 1024, '256M', '1G', '64KiB' (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise UsageError(f"{text!r} is not a message size; write bytes like 4, 1K, 256M or 1G")
    return int(m.group(1)) * UNITS[m.group(2)]


def human(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= UNITS[unit] and nbytes % UNITS[unit] == 0:
            return f"{nbytes // UNITS[unit]}{unit}"
    return f"{nbytes}"


def busbw_factor(n: int) -> float:
    return 2 * (n - 1) / n if n > 1 else 1.0


class HpclabCase:
    """hpclab's backend: device buffers from Numba, ``be.allreduce(send, out=out, check=False)``."""

    def __init__(self, be, dtype):
        self.be, self.dtype, self.name = be, np.dtype(dtype), be.name

    def prepare(self, count: int):
        be, cuda = self.be, backend.cuda()
        self.send = cuda.to_device(np.full(count, be.rank + 1, dtype=self.dtype))
        self.out = cuda.to_device(np.full(count, -1, dtype=self.dtype))  # a stale result in reused memory cannot pass
        be.check_same(self.send, "allreduce", self.out)  # once per size, not per call
        be.synchronize()
        send, out = self.send, self.out
        return lambda: be.allreduce(send, out=out, check=False)

    def verify(self, expected: float) -> bool:
        return bool(np.all(self.out.copy_to_host() == expected))

    def release(self) -> None:
        self.send = self.out = None
        self.be.release()


class RawNcclCase:
    """The baseline: CuPy arrays and cupy.cuda.nccl's allReduce, nothing else."""

    name = RAW

    def __init__(self, comm, dtype):
        import cupy as cp
        from cupy.cuda import nccl

        require_one_gpu_per_rank(comm)     # NCCL refuses ranks that share a device
        self.cp, self.nccl, self.dtype = cp, nccl, np.dtype(dtype)
        cp.cuda.Device(backend.cuda().get_current_device().id).use()
        self.nccl_type = nccl.NCCL_FLOAT32 if self.dtype == np.float32 else nccl.NCCL_FLOAT64
        self.rank = comm.rank
        self.comm = nccl.NcclCommunicator(comm.size, unique_id(comm), comm.rank)
        self.stream = cp.cuda.Stream.null

    def prepare(self, count: int):
        cp = self.cp
        self.send = cp.full(count, self.rank + 1, dtype=self.dtype)
        self.out = cp.full(count, -1, dtype=self.dtype)
        cp.cuda.Device().synchronize()
        c, s, o, t, sum_, stream = self.comm, self.send.data.ptr, self.out.data.ptr, self.nccl_type, \
            self.nccl.NCCL_SUM, self.stream

        def call():
            c.allReduce(s, o, count, t, sum_, stream.ptr)
            stream.synchronize()
        return call

    def verify(self, expected: float) -> bool:
        return bool(self.cp.all(self.out == expected).get())

    def release(self) -> None:
        self.send = self.out = None
        self.cp.get_default_memory_pool().free_all_blocks()


def backends_to_run(requested: str, comm, notes: list[str]) -> list[str]:
    if requested == "auto":
        name, why = choose(comm)
        notes.append(f"auto chose {name}: {why}")
        return [name]
    if requested != "all":
        return [requested]
    if backend.is_simulator():
        notes.append("simulator: only mpi-host runs here (mpi-cuda and nccl need real GPUs)")
        return ["mpi-host"]
    aware, how = cuda_aware()
    ok, why = nccl_available()
    shared = sharing(comm)
    skipped = {"mpi-cuda": None if comm.allreduce(aware, op=MPI().LAND) else f"MPI is not CUDA-aware ({how})",
               "nccl": f"{describe_sharing(shared)}, and {NEEDS_OWN_GPU}" if shared else None}
    if not shared and not comm.allreduce(ok, op=MPI().LAND):
        skipped["nccl"] = why
    notes += [f"{name} skipped: {reason}" for name, reason in skipped.items() if reason]
    return ["mpi-host", *(name for name, reason in skipped.items() if not reason)]


def table(rows: list[dict], n: int) -> str:
    head = (f"{'backend':<9} {'size':>6} {'bytes':>11} {'time (us)':>11} {'algbw GB/s':>11} {'busbw GB/s':>11} "
            f"{'reps':>4}  check")
    lines = [f"all-reduce over {n} ranks; busbw = algbw x 2(n-1)/n", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['backend']:<9} {human(r['size_bytes']):>6} {r['size_bytes']:>11} {r['time_us']:>11.2f} "
                     f"{r['algbw_GBps']:>11.3f} {r['busbw_GBps']:>11.3f} {r['repeats']:>4}  "
                     f"{'ok' if r['verified'] else 'WRONG'}")
    return "\n".join(lines)


def measure(cases, sizes, comm, dtype="float32", repeats=None) -> list[dict]:
    """One row per (size, case): sizes outer, so drift hits every backend alike."""
    n, sim = comm.size, backend.is_simulator()
    expected = n * (n + 1) / 2
    itemsize = np.dtype(dtype).itemsize
    rows = []
    for size in sizes:
        count = size // itemsize
        for case in cases:
            with step(comm, f"{case.name}: {size} B buffers"):
                call = case.prepare(count)
            # The first call (a warm-up) sets how many calls make ~0.3 s, and whether two more warm up (not for
            # calls over 50 ms); its time is the slowest rank's, so the plan is the same on every rank.
            once = wall(call, comm, sync=False)[2]
            reps = repeats or (3 if sim else int(min(50, max(3, 0.3 / max(once, 1e-6)))))
            for _ in range(0 if sim or once > 0.05 else 2):
                call()
            # every backend returns when the result is complete: a call's time is its slowest rank's
            t = float(statistics.median(wall(call, comm, sync=False)[2] for _ in range(reps)))
            ok = comm.allreduce(case.verify(expected), op=MPI().LAND)
            algbw = size / t / 1e9
            rows.append({"backend": case.name, "size_bytes": size, "count": count, "dtype": dtype,
                         "time_us": t * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(n),
                         "repeats": reps, "verified": bool(ok)})
            case.release()
    return rows


def run(comm, requested="all", sizes=("1K", "64K"), dtype="float32", repeats=None,
        raw=True) -> tuple[list[dict], list[str]]:
    """(rows, notes), the same on every rank (collective; usable from a ``%%px`` cell). ``requested``:
    auto, all, or a backend name; with nccl among them and ``raw``, the raw-NCCL baseline too."""
    sizes = [parse_size(s) if isinstance(s, str) else int(s) for s in sizes]
    notes: list[str] = []
    with step(comm, "backend setup"):
        names = backends_to_run(requested, comm, notes)
    # get() is collective and raises on every rank when a backend cannot run here
    cases = [HpclabCase(get(name, comm, quiet=True), dtype) for name in names]
    if "nccl" in names and raw:
        with step(comm, "raw NCCL baseline"):
            cases.append(RawNcclCase(comm, dtype))
    rows = measure(cases, sizes, comm, dtype, repeats)
    # NCCL communicators: destroyed in the same order on every rank (hpclab's together, by destroy_all)
    comm.Barrier()
    if "nccl" in names:
        if raw:
            cases[-1].comm.destroy()        # the raw baseline, the last case
        destroy_all()
    return rows, notes
