"""The five versions of a layer chain, each checked against V1.

V1 serial NumPy (rank 0)          V2 MPI on CPUs: NumPy bands, halos by mpi4py
V3 one GPU (rank 0)               V4 MPI + GPU, halos staged through host memory
V5 MPI + GPU, GPU-to-GPU halos (NCCL or CUDA-aware MPI; host-staged where neither exists,
   e.g. where ranks share a GPU: NCCL needs one per rank, and the answer is V4's either way)

Checks: max error relative to V1 (float32 sums in another order on the GPU),
and a digest — FNV-1a 64 of the values rounded to 5 significant digits —
which must be identical between a distributed version and its serial twin
on the same kind of processor (V2 = V1, V4 = V5 = V3): the band code sums
in exactly the serial order, so distribution must not change a single bit.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from hpclab import backend, comm as hcomm
from hpclab.halo.executors import Timer, run_device, run_host
from hpclab.halo import reference as ref
from hpclab.halo.bands import hash_values
from hpclab.mpi import first_ranks

VERSIONS = {
    "v1": "serial NumPy (one CPU)",
    "v2": "MPI on CPUs (NumPy bands, halos via mpi4py)",
    "v3": "one GPU",
    "v4": "MPI + GPU, host-staged halos (mpi-host)",
    "v5": "MPI + GPU, GPU-to-GPU halos",
}
TWIN = {"v1": "v1", "v2": "v1", "v3": "v3", "v4": "v3", "v5": "v3"}
DIGITS = 5


def _fnv1a(data: np.ndarray) -> int:
    h = 0xCBF29CE484222325
    for b in data.tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


try:  # compiled on the CPU when Numba's CPU target is there (it is wherever numba is)
    from numba import njit

    @njit(cache=False)
    def _fnv1a_fast(data):
        h = np.uint64(0xCBF29CE484222325)
        prime = np.uint64(0x100000001B3)
        for b in data:
            h = (h ^ np.uint64(b)) * prime
        return h
except Exception:  # noqa: BLE001
    _fnv1a_fast = None


def digest(x, digits: int = DIGITS) -> str:
    """FNV-1a 64 of the tensor's values rounded to ``digits`` significant digits, and its shape."""
    a = np.asarray(x, dtype=np.float64).ravel()
    mag = np.abs(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.where(mag > 0, np.floor(np.log10(np.where(mag > 0, mag, 1.0))), 0.0)
    mant = np.round(a / 10.0 ** (exp - digits + 1)).astype(np.int64)
    words = np.concatenate([np.asarray(np.shape(x), dtype=np.int64),
                            np.stack([mant, exp.astype(np.int64)], axis=1).ravel()])
    raw = words.view(np.uint8)
    h = int(_fnv1a_fast(raw)) if _fnv1a_fast is not None else _fnv1a(raw)
    return f"{h:016x}"


def max_rel_error(x, reference) -> float:
    """max |x - reference| / max |reference| (inf if the shapes differ)."""
    x, reference = np.asarray(x), np.asarray(reference)
    if x.shape != reference.shape:
        return float("inf")
    scale = float(np.max(np.abs(reference))) or 1.0
    return float(np.max(np.abs(x.astype(np.float64) - reference))) / scale


@dataclass
class Outcome:
    version: str
    out: np.ndarray | None            # rank 0 only
    wall_s: float                     # max over ranks: input to output band, median of repeats
    phases: dict = field(default_factory=dict)
    comm: str = ""
    note: str = ""


def gpu_aware_backend(comm, requested: str = "auto"):
    """A backend that moves device buffers without host staging, or mpi-host with a reason."""
    names = [requested] if requested not in ("auto", None) else ["auto", "nccl", "mpi-cuda"]
    tried = []
    for name in names:
        try:
            with hcomm.step(comm, f"communication backend {name}"):
                be = hcomm.get(name, comm)
        except Exception as exc:  # noqa: BLE001 - RankError or unknown name: try the next
            # The reason's first sentence: the fix it suggests is for another command.
            reason = str(exc).splitlines()[0].split(': ', 2)[-1]
            tried.append(f"{name}: {reason.split('. ')[0].split('; use')[0].rstrip('.')}")
            continue
        if be.name != "mpi-host" or requested == "mpi-host":
            return be, ""
        tried.append(f"{name}: gives mpi-host")
    why = "; ".join(tried)
    return hcomm.get("mpi-host", comm), (
        f"V5 wants NCCL or CUDA-aware MPI and neither is usable here ({why}); "
        "V5 ran with host-staged MPI (mpi-host), so it equals V4")


def _band(shape, seed, comm):
    n, c, h, w = shape
    r0, r1 = hcomm.block_range(h, comm.size, comm.rank)
    return hash_values((n, c, r1 - r0, w), seed, r0, h)


def _gather(band, comm, timer):
    from mpi4py import MPI

    t = MPI.Wtime()
    parts = comm.gather(band, root=0)
    timer.add("gather", MPI.Wtime() - t)
    return np.concatenate(parts, axis=2) if comm.rank == 0 else None


def _dense_host(dense, x):
    y = x.reshape(x.shape[0], -1)
    for op in dense:
        y = ref.linear(y, op.w, op.bias)
        y = ref.relu(y) if op.relu else y
    return y


def _dense_device(dense, x):
    from hpclab.halo.conv import cuda, linear_device

    y = cuda.to_device(np.ascontiguousarray(x.reshape(x.shape[0], -1)))
    for op in dense:
        y = linear_device(y, cuda.to_device(op.w), cuda.to_device(op.bias), op.relu)
    return y.copy_to_host()


def run_once(version: str, ops, dense, shape, seed, comm, be=None, overlap=True, sync=False):
    """One forward pass of ``version``; returns (output on rank 0, wall seconds, Timer).

    The wall time runs from the input on the host (made outside the timed
    region) to the output band on the host; gathering to rank 0 and the
    dense layers come after it. ``sync``: measure the phase split (GPU
    versions run without overlap, synchronised at every phase boundary).
    """
    from mpi4py import MPI

    timer = Timer(sync)
    serial = version in ("v1", "v3")
    if serial:   # rank 0 alone; the others wait for its outcome (an error there is raised everywhere)
        return _on_root(comm, lambda: (*_forward(version, ops, dense, shape, seed, MPI.COMM_SELF,
                                                 be, overlap, timer), timer), (None, 0.0, timer))
    out, wall = _forward(version, ops, [], shape, seed, comm, be, overlap, timer)
    if dense:
        out = _on_root(comm, lambda: _dense(version, dense, out, timer), None)
    return out, wall, timer


def _on_root(world, fn, elsewhere):
    """Run ``fn`` on rank 0 only; the other ranks wait, get ``elsewhere``, and raise if rank 0 failed.

    Without this, an error on rank 0 would leave the others waiting forever in
    the next collective call.
    """
    if world.size == 1:
        return fn()
    if world.rank == 0:
        try:
            result = fn()
        except Exception as exc:
            world.bcast(f"{type(exc).__name__}: {exc}", root=0)
            raise
        world.bcast(None, root=0)
        return result
    error = world.bcast(None, root=0)
    if error:
        raise RuntimeError(f"rank 0 failed ({error})")
    return elsewhere


def _forward(version, ops, dense, shape, seed, comm, be, overlap, timer):
    """Input band -> output band (gathered on rank 0); dense layers on rank 0 for serial versions."""
    from mpi4py import MPI

    serial = comm.size == 1 and version in ("v1", "v3")
    comm.Barrier()
    t0 = MPI.Wtime()
    x = hash_values(shape, seed) if serial else _band(shape, seed, comm)
    gen = MPI.Wtime() - t0
    t0 = MPI.Wtime()
    if version in ("v1", "v2"):
        y = run_host(ops, x, comm, overlap, timer)
    else:
        from hpclab.backend import cuda

        t = MPI.Wtime()
        xd = cuda().to_device(x)
        cuda().synchronize()
        timer.add("transfer", MPI.Wtime() - t)
        yd = run_device(ops, xd, comm, be, overlap, timer)
        t = MPI.Wtime()
        y = yd.copy_to_host()
        timer.add("transfer", MPI.Wtime() - t)
    local = MPI.Wtime() - t0
    wall = comm.allreduce(local, op=MPI.MAX)
    timer.add("input_generation", gen)
    out = y if serial else _gather(y, comm, timer)
    if dense and out is not None:
        out = _dense(version, dense, out, timer)
    return out, wall


def _dense(version, dense, out, timer):
    from mpi4py import MPI

    t = MPI.Wtime()
    out = _dense_host(dense, out) if version in ("v1", "v2") else _dense_device(dense, out)
    timer.add("dense", MPI.Wtime() - t)
    return out


def run_version(version: str, ops, dense, shape, seed, comm, comm_name="auto", overlap=True,
                repeats: int = 1, warmup: int = 0) -> Outcome:
    be, note, used = None, "", ""
    if version in ("v4", "v5") and comm.size > 1:
        if version == "v4":
            be = hcomm.get("mpi-host", comm)
        else:
            be, note = gpu_aware_backend(comm, comm_name)
        used = be.name
    elif version in ("v2",):
        used = "mpi4py (host)"
    for _ in range(warmup):
        run_once(version, ops, dense, shape, seed, comm, be, overlap)
    walls, out, timer = [], None, Timer()
    for _ in range(max(1, repeats)):
        out, wall, timer = run_once(version, ops, dense, shape, seed, comm, be, overlap)
        walls.append(wall)
    if needs_split_pass(version):
        timer = run_once(version, ops, dense, shape, seed, comm, be, overlap, sync=True)[2]
    from mpi4py import MPI

    phases = max_phases(timer, comm) if version not in ("v1", "v3") else comm.bcast(dict(timer.seconds), root=0)
    wall = comm.bcast(statistics.median(walls), root=0)
    return Outcome(version, out, wall, phases, used, note)


def max_phases(timer, comm) -> dict:
    """Seconds per phase, max over ranks. Ranks may have different phases (the dense
    layers run on rank 0 only), so agree on the names first: one allreduce per name on
    every rank, never a different number of them (that would hang)."""
    from mpi4py import MPI

    names = sorted(set().union(*comm.allgather(sorted(timer.seconds))))
    return {k: comm.allreduce(timer.seconds.get(k, 0.0), op=MPI.MAX) for k in names}


def needs_split_pass(version: str) -> bool:
    """GPU kernels run asynchronously: their time split needs a separate synchronised pass.

    (CPU versions are synchronous, and so is the simulator.)"""
    return version in ("v3", "v4", "v5") and not backend.is_simulator()


def parse_versions(text: str) -> list[str]:
    """'all', 'v4' or 'v1,v4' -> the versions to run (their serial twins added)."""
    wanted = list(VERSIONS) if text == "all" else [v.strip().lower() for v in text.split(",") if v.strip()]
    bad = [v for v in wanted if v not in VERSIONS]
    if bad or not wanted:
        raise ValueError(f"unknown version {', '.join(bad) or repr(text)}; use all or a comma list of "
                         f"{', '.join(VERSIONS)}")
    need = set(wanted) | {"v1"} | {TWIN[v] for v in wanted}
    return [v for v in VERSIONS if v in need]


def scaling_point(mode: str, ranks: int, ops, shape, comm, version: str = "v4", overlap: bool = True,
                  repeats: int = 1, seed: int = 1) -> dict | None:
    """Time ``version`` on the first ``ranks`` ranks of ``comm`` (the others wait).

    Returns, on the ranks that ran, {mode, ranks, height, wall_s, compute, halo, transfer,
    ranks_per_gpu} (seconds, max over the ranks that ran; the split from a synchronised pass
    on a GPU; ranks_per_gpu > 1: they took turns on a GPU, time sharing, not scaling);
    None elsewhere.
    """
    with first_ranks(comm, ranks) as sub:
        point = None if sub is None else _time_band(mode, ranks, ops, shape, sub, version, overlap, repeats, seed)
    comm.Barrier()   # the ranks left out wait for the others
    return point


def _time_band(mode, ranks, ops, shape, sub, version, overlap, repeats, seed) -> dict:
    from hpclab.device import ranks_per_gpu

    be = hcomm.get("mpi-host", sub) if version in ("v4", "v5") else None
    if version == "v5" and ranks > 1:
        be, _ = gpu_aware_backend(sub)
    walls, timer = [], None
    for _ in range(max(1, repeats)):
        _, wall, timer = run_once(version, ops, [], shape, seed, sub, be, overlap)
        walls.append(wall)
    if needs_split_pass(version):
        timer = run_once(version, ops, [], shape, seed, sub, be, overlap, sync=True)[2]
    phases = max_phases(timer, sub)
    return {"mode": mode, "ranks": ranks, "height": shape[2], "wall_s": statistics.median(walls),
            **{k: phases.get(k, 0.0) for k in ("compute", "halo", "transfer")},
            "ranks_per_gpu": ranks_per_gpu(sub)}
