"""Workshop Exercise 3: one process drives every GPU of the node; NCCL adds the hits.

One process, no MPI: ``ncclCommInitAll`` (CuPy's ``NcclCommunicator.initAll``)
makes one communicator per GPU at once. Each GPU counts the hits of its
contiguous share of the samples (one host thread per GPU launches its
kernel, so the GPUs work at the same time), then a single NCCL group
all-reduces the per-GPU counts, GPU to GPU, with no copy through the host.

One process holds every communicator, so ranks never share a GPU here: on a
machine with one GPU it is one communicator over one device, the exercise at
its smallest. Under mpiexec with several ranks it refuses (that would be
Exercise 4), on every rank, saying so.

On the simulator there is one simulated device and no NCCL: the same shares
are counted one after another on it and added on the host, so the
decomposition and the check still run. The count for a sample depends only
on its global index (``hpclab.pi.fast.count_hits``), so the total is the
same for any number of GPUs.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hpclab import backend
from hpclab.decomp import block_range, require_at_least
from hpclab.errors import step
from hpclab.options import UsageError, count
from hpclab.runner import Report
from hpclab.pi.check import estimate
from hpclab.pi.program import add_launch_arguments, add_sample_arguments, check_work, final_lines

HELP = ("Workshop Exercise 3: Monte Carlo pi with ONE process driving all GPUs of the node; "
        "the per-GPU hit counts are combined by an NCCL all-reduce (ncclCommInitAll).")


def add_arguments(parser) -> None:
    add_sample_arguments(parser, 2024, "total samples over all GPUs (default 1e10 on GPUs, 4096 on the simulator)")
    parser.add_argument("--gpus", type=count(1, 1024), default=None,
                        help="GPUs to drive (default: all of this node's; 2 shares on the simulator)")
    add_launch_arguments(parser)


def default_samples() -> int:
    return backend.auto_size(gpu=10**10, sim=4096)


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
    check_work("--samples", args.samples or default_samples(), "samples", gpus, launch)


def _count_share(cuda, count_hits, device, lo, hi, args):
    """Hits of samples [lo, hi) on GPU ``device`` (runs in its own host thread)."""
    with cuda.gpus[device]:
        t0 = time.perf_counter()
        hits = count_hits(lo, hi - lo, args.seed, blocks=args.blocks, threads=args.threads)
        seconds = time.perf_counter() - t0
        buf = cuda.to_device(np.array([hits], dtype=np.int64))  # the count, on its GPU
        stream = cuda.stream()
    return hits, seconds, buf, stream


def _nccl_all_gpus(shares, args, report_notes):
    """The real thing: initAll, counts on every GPU at once, one grouped all-reduce."""
    from hpclab.comm.nccl import load, pointer, stream_handle, version_string
    from hpclab.pi.fast import count_hits

    cuda = backend.cuda()
    nccl = load()
    ndev = len(shares)
    t_init = time.perf_counter()
    comms = nccl.NcclCommunicator.initAll(list(range(ndev)))
    t_init = time.perf_counter() - t_init

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=ndev) as pool:
        counted = list(pool.map(lambda d: _count_share(cuda, count_hits, d, *shares[d], args), range(ndev)))
    t_compute = time.perf_counter() - t0

    t1 = time.perf_counter()
    nccl.groupStart()  # one call per communicator, launched together
    try:
        for d, (_, _, buf, stream) in enumerate(counted):
            with cuda.gpus[d]:
                comms[d].allReduce(pointer(buf), pointer(buf), 1, nccl.NCCL_INT64, nccl.NCCL_SUM,
                                   stream_handle(stream))
    finally:
        nccl.groupEnd()
    totals = []
    for d, (_, _, buf, stream) in enumerate(counted):
        with cuda.gpus[d]:
            stream.synchronize()
            totals.append(int(buf.copy_to_host()[0]))
    t_reduce = time.perf_counter() - t1
    total_time = time.perf_counter() - t0
    for c in comms:
        c.destroy()
    combined = f"NCCL all-reduce (NCCL {version_string(nccl)}, ncclCommInitAll over {ndev} GPUs)"
    times = {"init_s": t_init, "compute_s": t_compute, "allreduce_s": t_reduce, "total_s": total_time}
    return [h for h, *_ in counted], [s for _, s, *_ in counted], totals, combined, times


def _simulated(shares, args, notes):
    """Same decomposition on the single simulated device; the host adds the counts."""
    from hpclab.pi.fast import count_hits

    notes.append("Exercise 3 needs real GPUs and NCCL (ncclCommInitAll); on the Numba CUDA simulator "
                 "the shares are counted one after another on its single device and added on the host.")
    t0 = time.perf_counter()
    hits, seconds = [], []
    for lo, hi in shares:
        t = time.perf_counter()
        hits.append(count_hits(lo, hi - lo, args.seed, blocks=args.blocks, threads=args.threads))
        seconds.append(time.perf_counter() - t)
    t_compute = time.perf_counter() - t0
    t1 = time.perf_counter()
    total = int(np.sum(np.array(hits, dtype=np.int64)))
    t_reduce = time.perf_counter() - t1
    times = {"init_s": 0.0, "compute_s": t_compute, "allreduce_s": t_reduce,
             "total_s": time.perf_counter() - t0}
    return hits, seconds, [total] * len(shares), "host sum (simulator: no NCCL)", times


def run(args, ctx) -> Report:
    comm = ctx.comm
    sim = backend.is_simulator()
    samples = args.samples or default_samples()
    with step(comm, "input check"):
        available = len(backend.cuda().gpus)
        ndev = args.gpus or (2 if sim else available)
        if not sim and ndev > available:
            raise ValueError(f"--gpus {ndev} but this node has {available} GPU(s) visible; "
                             f"use --gpus {available} or fewer")
        require_at_least(samples, ndev, "samples")
        if not sim:
            from hpclab.comm.nccl import load

            load()  # fails here, naming NCCL, if CuPy's NCCL is missing
    shares = [block_range(samples, ndev, d) for d in range(ndev)]
    notes: list[str] = []
    with step(comm, "pi on every GPU"):
        run_all = _simulated if sim else _nccl_all_gpus
        hits, seconds, totals, combined, times = run_all(shares, args, notes)

    total = totals[0]
    e = estimate(total, samples)
    consistent = all(t == total for t in totals) and total == sum(hits)
    lines = [f"GPU {d}/{ndev} | samples={hi - lo} | local hits={h} | time = {s:.6f} s"
             for d, ((lo, hi), h, s) in enumerate(zip(shares, hits, seconds))]
    if not consistent:
        notes.append(f"the all-reduced totals {totals} do not all equal the sum of the local "
                     f"hits {sum(hits)}: the reduction is wrong")
    if not e["within_5_sigma"]:
        notes.append(f"pi estimate {e['pi']:.8f} is more than 5 sigma ({5 * e['sigma']:.2e}) "
                     "from pi: the hit counter is wrong")
    final = [*final_lines(total, samples, "Total time", times["total_s"]),
             ("GPUs", str(ndev)), ("Combined by", combined)]
    return Report(
        rank_line="\n".join(lines), final=final, notes=notes,
        passed=bool(consistent and e["within_5_sigma"]),
        result={"pi": e["pi"], "hits": total, "samples": samples, "gpus": ndev, "seed": args.seed,
                "per_gpu_hits": hits, "combined_by": combined, "abs_error": e["abs_error"],
                "sigma": e["sigma"]},
        timings=times,
    )
