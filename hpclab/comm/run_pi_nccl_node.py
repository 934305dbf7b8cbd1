"""Workshop Exercise 3: one process, no MPI, drives every GPU of the node; NCCL adds the hits.

``ncclCommInitAll`` (CuPy's ``NcclCommunicator.initAll``) makes one communicator per GPU at once; each
GPU counts the hits of its share of the samples (one host thread per GPU, so they work at the same
time), then one NCCL group all-reduces the counts, GPU to GPU. A sample's count depends only on its
global index, so the total is the same for any number of GPUs.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np

from hpclab import backend
from hpclab.comm.nccl import load, pointer, stream_handle, version_string
from hpclab.decomp import block_range
from hpclab.errors import step
from hpclab.options import UsageError, count
from hpclab.runner import Program, Report
from hpclab.pi.program import Work, add_launch_arguments, add_sample_arguments, combined

PROGRAM = Program("pi-nccl-node", "comm")
SAMPLES = Work("samples", gpu=10**10, sim=4096)
HELP = ("Workshop Exercise 3: Monte Carlo pi with ONE process driving all GPUs of the node; "
        "the per-GPU hit counts are combined by an NCCL all-reduce (ncclCommInitAll).")


def add_arguments(parser) -> None:
    add_sample_arguments(parser, 2024, "total samples over all GPUs (default 1e10 on GPUs, 4096 on the simulator)")
    parser.add_argument("--gpus", type=count(1, 1024), default=None,
                        help="GPUs to drive (default: all of this node's; 2 shares on the simulator)")
    add_launch_arguments(parser)


def validate(args, launch) -> None:
    if launch.ranks != 1:
        raise UsageError(
            f"Exercise 3 is ONE process driving every GPU, but {launch.ranks} ranks started it. Run it "
            "without mpiexec (python -m hpclab run pi-nccl-node); for one rank per GPU use "
            "mpiexec -n <GPUs> python -m hpclab run pi-nccl-mpi (Exercise 4).")
    gpus = args.gpus or 2
    available = backend.count_gpus() if launch.backend == "gpu" else 0
    if available:                   # 0: checked where it will run (hpclab scaling on a login node)
        gpus = args.gpus or available
        if gpus > available:
            raise UsageError(f"--gpus {gpus} but this node has {available} GPU(s) visible; "
                             f"use --gpus {available} or fewer")
    SAMPLES.check(args, launch, gpus)


def _count(shares, args, on_gpus: bool):
    """(hits, seconds, (count on its GPU, stream) or None) of each share [lo, hi): on GPUs each in a
    host thread of its own, at the same time; on the simulator one after another on its one device."""
    from hpclab.pi.fast import count_hits      # loads numba.cuda: not needed to reject bad arguments

    cuda = backend.cuda()

    def one(d):
        lo, hi = shares[d]
        with cuda.gpus[d] if on_gpus else nullcontext():
            t0 = time.perf_counter()
            hits = count_hits(lo, hi - lo, args.seed, blocks=args.blocks, threads=args.threads)
            seconds = time.perf_counter() - t0
            on_gpu = (cuda.to_device(np.array([hits], dtype=np.int64)), cuda.stream()) if on_gpus else None
            return hits, seconds, on_gpu

    if not on_gpus:
        return [one(d) for d in range(len(shares))]
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        return list(pool.map(one, range(len(shares))))


def _all_reduce(counted, comms, nccl) -> list[int]:
    """Every GPU's count all-reduced in one NCCL group; each GPU's total."""
    cuda = backend.cuda()
    nccl.groupStart()  # one call per communicator, launched together
    try:
        for d, (_, _, (buf, stream)) in enumerate(counted):
            with cuda.gpus[d]:
                comms[d].allReduce(pointer(buf), pointer(buf), 1, nccl.NCCL_INT64, nccl.NCCL_SUM, stream_handle(stream))
    finally:
        nccl.groupEnd()
    totals = []
    for d, (_, _, (buf, stream)) in enumerate(counted):
        with cuda.gpus[d]:
            stream.synchronize()
            totals.append(int(buf.copy_to_host()[0]))
    return totals


def run(args, ctx) -> Report:
    sim = backend.is_simulator()
    samples = SAMPLES.of(args)
    ndev = args.gpus or (2 if sim else len(backend.cuda().gpus))    # validate() checked it against them
    shares = [block_range(samples, ndev, d) for d in range(ndev)]
    with step(ctx.comm, "input check"):
        nccl = None if sim else load()      # fails here, naming NCCL, if CuPy's NCCL is missing
    # initAll, counts on every GPU at once, one grouped all-reduce of them; without NCCL (the simulator,
    # one device) the shares are counted one after another and the host adds them.
    with step(ctx.comm, "pi on every GPU"):
        t0 = time.perf_counter()
        comms = nccl.NcclCommunicator.initAll(list(range(ndev))) if nccl else []
        t1 = time.perf_counter()
        counted = _count(shares, args, on_gpus=not sim)
        t2 = time.perf_counter()
        hits = [h for h, *_ in counted]
        totals = [sum(hits)] * ndev if sim else _all_reduce(counted, comms, nccl)
        t3 = time.perf_counter()
        for c in comms:
            c.destroy()
    combined_by = ("host sum (simulator: no NCCL)" if sim
                   else f"NCCL all-reduce (NCCL {version_string(nccl)}, ncclCommInitAll over {ndev} GPUs)")
    report = combined(totals, hits, samples, args.seed, "the all-reduce", "Total time", t3 - t1)
    report.rank_line = "\n".join(f"GPU {d}/{ndev} | samples={hi - lo} | local hits={h} | time = {s:.6f} s"
                                 for d, ((lo, hi), (h, s, _)) in enumerate(zip(shares, counted)))
    if sim:
        report.notes.insert(0, "Exercise 3 needs real GPUs and NCCL (ncclCommInitAll); on the Numba CUDA "
                            "simulator the shares are counted one after another on its single device and "
                            "added on the host.")
    report.final += [("GPUs", str(ndev)), ("Combined by", combined_by)]
    report.result.update(gpus=ndev, per_gpu_hits=hits, combined_by=combined_by)
    report.timings = {"init_s": t1 - t0, "compute_s": t2 - t1, "allreduce_s": t3 - t2, "total_s": t3 - t1}
    return report
