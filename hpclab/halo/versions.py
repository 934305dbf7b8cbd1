"""The five versions of a layer chain, each checked against V1.

V1 serial NumPy (rank 0)          V2 MPI on CPUs: NumPy bands, halos by mpi4py
V3 one GPU (rank 0)               V4 MPI + GPU, halos staged through host memory
V5 MPI + GPU, GPU-to-GPU halos (NCCL or CUDA-aware MPI; host-staged where neither exists,
   e.g. where ranks share a GPU: NCCL needs one per rank, and the answer is V4's either way)

Checks: max error relative to V1 (the GPU sums float32 in another order), and a digest (``digest``)
identical between a distributed version and its serial twin on the same kind of processor (V2 = V1,
V4 = V5 = V3): the bands sum in exactly the serial order, so distribution must not change a bit.
"""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass

import numpy as np

from hpclab import backend, comm as hcomm
from hpclab.device import ranks_per_gpu
from hpclab.halo import alexnet
from hpclab.halo.bands import hash_values
from hpclab.halo.executors import Buffers, run_device, run_host
from hpclab.mpi import MPI, first_ranks
from hpclab.timeline import Timeline
from hpclab.timing import Phases, wall

VERSIONS = {"v1": "serial NumPy (one CPU)", "v2": "MPI on CPUs (NumPy bands, halos via mpi4py)", "v3": "one GPU",
            "v4": "MPI + GPU, host-staged halos (mpi-host)", "v5": "MPI + GPU, GPU-to-GPU halos"}
TWIN = {"v1": "v1", "v2": "v1", "v3": "v3", "v4": "v3", "v5": "v3"}
DIGITS = 5


def digest(x, digits: int = DIGITS) -> str:
    """A 64-bit hash (BLAKE2) of the tensor's values rounded to ``digits`` significant digits, and its shape."""
    a = np.asarray(x, dtype=np.float64).ravel()
    mag = np.abs(a)
    exp = np.floor(np.log10(np.where(mag > 0, mag, 1.0)))          # 0 for zeros (and NaN)
    mant = np.round(a / 10.0 ** (exp - digits + 1)).astype(np.int64)
    words = np.concatenate([np.asarray(np.shape(x), dtype=np.int64),
                            np.stack([mant, exp.astype(np.int64)], axis=1).ravel()])
    return hashlib.blake2b(words.tobytes(), digest_size=8).hexdigest()


def max_rel_error(x, reference) -> float:
    """max |x - reference| / max |reference| (inf if the shapes differ)."""
    x, reference = np.asarray(x), np.asarray(reference)
    if x.shape != reference.shape:
        return float("inf")
    scale = float(np.max(np.abs(reference))) or 1.0
    return float(np.max(np.abs(x.astype(np.float64) - reference))) / scale


@dataclass
class Outcome:
    out: np.ndarray | None            # rank 0 only
    wall_s: float                     # max over ranks: input to output band, median of repeats
    phases: dict                      # seconds per phase, max over ranks
    comm: str                         # the halos' backend
    note: str                         # why V5 fell back to host staging


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


def with_twins(wanted) -> list[str]:
    """The versions to run for ``wanted`` (names, or "all"): V1 and each one's serial twin added."""
    wanted = list(VERSIONS) if "all" in wanted else list(wanted)
    need = {"v1", *wanted, *(TWIN[v] for v in wanted)}
    return [v for v in VERSIONS if v in need]


def _on_root(comm, what: str, fn, elsewhere):
    """``fn()`` on rank 0 alone, ``elsewhere`` on the others; an error on rank 0 is raised on every rank."""
    result = elsewhere
    with hcomm.step(comm, what):
        if comm.rank == 0:
            result = fn()
    return result


def _dense(version, dense, x, phases):
    """The dense layers on whole images (N, ...) -> (N, classes), on the CPU or the GPU."""
    gpu = version not in ("v1", "v2")
    with phases("dense"):
        y = x.reshape(x.shape[0], -1)
        y = backend.cuda().to_device(np.ascontiguousarray(y)) if gpu else y
        for op in dense:
            y = op.device(y) if gpu else op.host(y)
        return y.copy_to_host() if gpu else y


def _forward(version, ops, shape, seed, comm, be, overlap, phases, buffers):
    """(the output gathered on rank 0, wall seconds from this rank's input band on the host, made before
    the timed region, to its output band on the host, max over ranks)."""
    n, c, h, w = shape
    with phases("input_generation"):
        r0, r1 = hcomm.block_range(h, comm.size, comm.rank)
        x = hash_values((n, c, r1 - r0, w), seed, r0, h)

    def layers():
        if version in ("v1", "v2"):
            return run_host(ops, x, comm, overlap, phases)
        cuda = backend.cuda()
        with phases("transfer"):
            xd = cuda.to_device(x)
            cuda.synchronize()     # the copy may still be in flight, and the executor's streams do not wait for it
        yd = run_device(ops, xd, comm, be, overlap, phases, buffers)
        with phases("transfer"):
            return yd.copy_to_host()

    y, _, seconds = wall(layers, comm, sync=False)
    if comm.size > 1:
        with phases("gather"):
            parts = comm.gather(y, root=0)
        y = np.concatenate(parts, axis=2) if comm.rank == 0 else None
    return y, seconds


def run_version(version: str, ops, dense, shape, seed, comm, comm_name="auto", overlap=True,
                repeats: int = 1, warmup: int = 0) -> Outcome:
    """``repeats`` timed passes of ``version`` after ``warmup`` ones (the median wall time), and the time per
    phase (max over ranks, the median over passes; on a GPU from as many separate passes without overlap,
    synchronised at every phase boundary). Gathering to rank 0 and the dense layers (on rank 0) come after
    the timed region."""
    be, note, used = None, "", "mpi4py (host)" if version == "v2" else ""
    if version in ("v4", "v5") and comm.size > 1:
        be, note = (hcomm.get("mpi-host", comm), "") if version == "v4" else gpu_aware_backend(comm, comm_name)
        used = be.name
    buffers = Buffers() if version in ("v3", "v4", "v5") else None
    alone = version in ("v1", "v3")          # rank 0 alone

    def once(sync=False):
        phases = Phases(sync=sync)
        forward = lambda on: _forward(version, ops, shape, seed, on, be, overlap, phases, buffers)  # noqa: E731
        if alone:
            out, seconds = _on_root(comm, f"{version.upper()} on rank 0", lambda: forward(MPI().COMM_SELF), (None, 0.0))
        else:
            out, seconds = forward(comm)
        if dense:
            out = _on_root(comm, "the dense layers on rank 0", lambda: _dense(version, dense, out, phases), None)
        return out, seconds, phases

    for _ in range(warmup):
        once()
    walls, splits = [], []
    for _ in range(repeats):
        out, seconds, phases = once()
        walls.append(seconds)
        splits.append(phases)
    if version in ("v3", "v4", "v5") and not backend.is_simulator():
        # GPU kernels run asynchronously: the split needs synchronised passes, as many as the timed ones
        splits = [once(sync=True)[2] for _ in range(repeats)]
    per_pass = [comm.bcast(dict(p.seconds), root=0) if alone else p.max_over_ranks(comm) for p in splits]
    # the median over passes, phase by phase: one slow pass does not make the bar
    times = {name: statistics.median(t.get(name, 0.0) for t in per_pass)
             for name in dict.fromkeys(name for t in per_pass for name in t)}
    return Outcome(out, comm.bcast(statistics.median(walls), root=0), times, used, note)


def scaling_point(mode: str, ranks: int, ops, shape, comm, version: str = "v4") -> dict | None:
    """Time ``version`` on the first ``ranks`` ranks of ``comm`` (the others wait; on a GPU the median of three
    passes after an untimed one): on the ranks that ran,
    {mode, ranks, height, wall_s, compute, halo, transfer, ranks_per_gpu} (seconds, max over those ranks;
    ranks_per_gpu > 1: they took turns on a GPU, time sharing, not scaling); None elsewhere."""
    point = None
    with first_ranks(comm, ranks) as sub:
        if sub is not None:
            o = run_version(version, ops, [], shape, 1, sub, repeats=backend.auto_size(gpu=3, sim=1),
                            warmup=backend.auto_size(gpu=1, sim=0))   # as the conv-halo program times them
            point = {"mode": mode, "ranks": ranks, "height": shape[2], "wall_s": o.wall_s,
                     **{k: o.phases.get(k, 0.0) for k in ("compute", "halo", "transfer")},
                     "ranks_per_gpu": ranks_per_gpu(sub)}
    comm.Barrier()   # the ranks left out wait for the others
    return point


def timeline_layer(comm, overlap: bool, rows_per_rank: int | None = None) -> list[dict] | None:
    """A halo layer (C2, 2,048 rows a rank, 256 wide on a GPU; GPU-to-GPU halos where there are) after an
    untimed one: every rank's spans (:mod:`hpclab.timeline`) on rank 0."""
    scale = backend.auto_size(gpu=1, sim=32)
    c = alexnet.input_channels("c2", scale)
    h, w = comm.size * (rows_per_rank or backend.auto_size(gpu=2048, sim=6)), backend.auto_size(gpu=256, sim=7)
    r0, r1 = hcomm.block_range(h, comm.size, comm.rank)
    x = backend.cuda().to_device(hash_values((1, c, r1 - r0, w), 1, r0, h))
    be = gpu_aware_backend(comm)[0] if comm.size > 1 else None
    ops, buffers = alexnet.conv_ops("c2", c, scale)[:1], Buffers()
    for tl in (None, Timeline()):
        if tl:
            tl.start(comm)
        run_device(ops, x, comm, be, overlap, buffers=buffers, height=h, timeline=tl)
    return tl.spans()
