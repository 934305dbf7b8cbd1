"""Workshop Exercise 4: one MPI rank per GPU; MPI starts NCCL (its only job), NCCL adds the hits.

Each rank counts the hits of its share of the samples, and NCCL all-reduces the counts from GPU
memory. Without NCCL (the simulator) or where ranks share a GPU, host-staged MPI adds them by default,
with a note saying why; an explicit ``--backend nccl`` is then refused on every rank.
"""
from __future__ import annotations

import numpy as np

from hpclab import backend
from hpclab.comm import BACKENDS, get
from hpclab.errors import step
from hpclab.comm.nccl import NEEDS_OWN_GPU
from hpclab.device import describe_sharing, sharing
from hpclab.runner import Program, Report
from hpclab.timing import wall
from hpclab.pi.program import Work, add_launch_arguments, add_sample_arguments, combined, my_share, rank_line

PROGRAM = Program("pi-nccl-mpi", "comm", "--samples", "samples")
SAMPLES = Work("samples", gpu=10**11, sim=4096)
validate = SAMPLES.check     # the input check of `hpclab run` (runner.checked)
HELP = ("Workshop Exercise 4: Monte Carlo pi with one MPI rank per GPU; MPI only bootstraps NCCL, "
        "and the hit counts are all-reduced by NCCL (host-staged MPI on the simulator, or where "
        "ranks share a GPU).")


def add_arguments(parser) -> None:
    add_sample_arguments(parser, 2024, "total samples over all ranks (default 1e11 on GPUs, 4096 on the simulator)")
    parser.add_argument("--backend", default=None, choices=BACKENDS,
                        help="communication backend (default: nccl with one GPU per rank; mpi-host where ranks "
                             "share a GPU and on the simulator)")
    add_launch_arguments(parser)


def run(args, ctx) -> Report:
    comm, rank, size = ctx.comm, ctx.comm.rank, ctx.comm.size
    sim = backend.is_simulator()
    samples = SAMPLES.of(args)
    notes = []
    from hpclab.pi.fast import count_hits       # loads numba.cuda: not needed to reject bad arguments

    shared = sharing(comm)  # collective: the same list on every rank
    name = args.backend or ("mpi-host" if sim or shared else "nccl")
    if args.backend is None and sim:
        notes.append("Exercise 4 combines the hits with NCCL on GPUs; on the Numba CUDA simulator there "
                     "is no NCCL, so host-staged MPI (mpi-host) does it here.")
    elif args.backend is None and shared:
        notes.append(f"Exercise 4 combines the hits with NCCL, one rank per GPU; here {describe_sharing(shared)}, "
                     f"and {NEEDS_OWN_GPU}, so host-staged MPI (mpi-host) adds them. Start one rank per "
                     "GPU to run it over NCCL.")
    be = get(name, comm)  # collective; for nccl: unique id on rank 0, MPI broadcast, communicator

    lo, hi, blocks, threads = my_share(comm, samples, args)
    with step(comm, "kernel compilation (warm-up)"):   # Numba compiles on the first call: not in the timed region
        count_hits(0, 2, args.seed, 1, threads)
    with step(comm, "hit counting"):
        hits, t_local, t_compute = wall(lambda: count_hits(lo, hi - lo, args.seed, blocks, threads), comm)
    mine = backend.cuda().to_device(np.array([hits], dtype=np.int64))
    be.allreduce(mine)  # warm up the path (first NCCL call sets up its channels)
    total_dev, _, t_reduce = wall(lambda: be.allreduce(mine), comm)
    total = int(total_dev.copy_to_host()[0])

    # Checking only, after the fact: every rank's local count and total to rank 0.
    everyone = comm.gather((hits, total), root=0)
    t_wall = t_compute + t_reduce
    report = Report(
        rank_line=rank_line(ctx.placement, "samples", hi - lo, blocks, threads, f"hits = {hits}", t_local),
        timings={"compute_s": t_compute, "allreduce_s": t_reduce, "wall_s": t_wall},
        notes=notes,
    )
    if rank == 0:
        local = [h for h, _ in everyone]
        summary = combined([t for _, t in everyone], local, samples, args.seed, f"{be.name} all-reduce",
                           "Wall time", t_wall)
        report.passed = summary.passed
        report.notes += summary.notes
        report.final = [*summary.final, ("Combined by", be.describe())]
        report.result = {**summary.result, "ranks": size, "per_rank_hits": local, "comm_backend": be.name}
    report.passed = comm.bcast(report.passed, root=0)     # the exit status is the same on every rank
    return report
