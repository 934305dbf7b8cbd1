"""Exercise 0 on device data, and a ring all-reduce by hand checked against MPI's."""
from __future__ import annotations

import numpy as np

from hpclab import backend, budget
from hpclab.collectives import check
from hpclab.collectives.kernels import fill
from hpclab.collectives.patterns import exercise0
from hpclab.collectives.ring import ring_allreduce, ring_bytes_per_rank
from hpclab.comm import BACKENDS, get
from hpclab.errors import step
from hpclab.mpi import MPI
from hpclab.options import count
from hpclab.runner import Program, Report
from hpclab.timing import wall

PROGRAM = Program("collectives", "collectives")
HELP = ("Workshop Exercise 0: Send/Recv, Bcast, Scatter, Gather, Reduce, Allreduce, "
        "Allgather, ReduceScatter on each rank's GPU data, then a hand-written ring all-reduce.")


def add_arguments(parser) -> None:
    parser.add_argument("--count", type=count(1, (1 << 63) - 1), default=None,
                        help="elements in the ring all-reduce buffer (default: 1M on a GPU, 1000 on the simulator)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="communication backend (default auto)")


def default_count() -> int:
    return backend.auto_size(gpu=1 << 20, sim=1000)


def validate(args, launch) -> None:
    n = args.count or default_count()
    budget.require_share("--count", n, launch.ranks, "elements")
    # float64 on every rank: its data, the ring's result and working copies, MPI's result
    budget.refuse_large("--count", n, launch.node_bytes(6 * 8 * n, 6 * 8 * n),
                        f"six float64 buffers of {n} elements on each of {launch.ranks_per_node} rank(s) here",
                        available=launch.memory)


def run(args, ctx) -> Report:
    comm, size, rank = ctx.comm, ctx.comm.size, ctx.comm.rank
    count = args.count or default_count()
    with step(comm, "backend"):
        be = get(args.backend, comm)

    held, _, t_ex0 = wall(lambda: exercise0(be), comm)
    everyone = comm.allgather(held)
    verdicts = [check.collective(name, [h[name] for h in everyone], quiet=True) for name in held]

    # Ring all-reduce of a vector that differs per rank, against MPI's Allreduce.
    data = fill(count, rank + 1.0, 1.0).copy_to_host()
    (ring, sent), _, t_ring = wall(lambda: ring_allreduce(data, comm), comm, sync=False)
    reference = np.empty_like(data)
    _, _, t_mpi = wall(lambda: comm.Allreduce(data, reference, op=MPI().SUM), comm, sync=False)
    ring_ok = check.allreduce(ring, reference, sent, data.nbytes, size, quiet=True)
    ideal = ring_bytes_per_rank(data.nbytes, size)
    all_ok = comm.allreduce(bool(ring_ok) and all(verdicts), op=MPI().LAND)

    report = Report(
        rank_line=(f"{ctx.placement.label()} | value = [{rank + 1}] | allreduce = {held['allreduce']} "
                   f"| allgather = {held['allgather']} | ring bytes sent = {sent}"),
        passed=all_ok,
        timings={"exercise0_s": t_ex0, "ring_allreduce_s": t_ring, "mpi_allreduce_s": t_mpi},
    )
    if rank == 0:
        names = {"sendrecv": "Send/Recv (ring)", "bcast": "Bcast (root 0)", "scatter": "Scatter (root 0)",
                 "gather": "Gather (root 0)", "reduce": "Reduce (SUM)", "allreduce": "AllReduce (SUM)",
                 "allgather": "AllGather", "reduce_scatter": "ReduceScatter (SUM)"}
        report.final = [("Start", check.format_gpus([[r + 1] for r in range(size)]))]
        report.final += [(names[n], check.format_gpus([h[n] for h in everyone])) for n in held]
        report.final += [
            ("Ring elements", f"{count} float64 ({data.nbytes} bytes)"),
            ("Ring bytes/rank", f"{sent} sent by rank 0; 2(N-1)/N x size = {ideal:.0f}"),
            ("Ring vs MPI", "identical" if ring_ok else "DIFFERENT"),
            ("Ring time", f"{t_ring:.6f} s (MPI Allreduce {t_mpi:.6f} s)"),
        ]
        report.notes = [v.message for v in [*verdicts, ring_ok] if not v]
        report.result = {"exercise0": {n: [h[n] for h in everyone] for n in held},
                         "ring_bytes_sent": sent, "ring_bytes_ideal": ideal,
                         "ring_matches_mpi": bool(ring_ok), "count": count}
    return report
