"""Every `hpclab run` program, and what the harness knows of each.

The command line, the runner, scaling sweeps, the recorded results and benchmarks/record.py read this
table only: a program is one line here and a module defining ``HELP`` (one line), ``add_arguments(parser)``,
``validate(args, launch)`` (what the arguments cost: ``hpclab.budget``) and ``run(args, ctx) -> Report``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Program:
    module: str
    topic: str                      # its notebook's topic: the curated table it is recorded in
    work: str | None = None         # the size option a weak scaling sweep multiplies by the ranks
    unit: str = "work"              # what a sweep's work (that option, or --work-arg) counts
    a100: str | None = None         # the workshop exercise whose A100 runs time the same program


PROGRAMS = {
    "collectives": Program("hpclab.collectives.run", "collectives"),
    "pi-midpoint": Program("hpclab.pi.run_midpoint", "pi", "--bins", "bins", "ex1_pi_midpoint"),
    "pi-mc": Program("hpclab.pi.run_mc", "pi", "--samples", "samples", "ex2_pi_mc"),
    "matmul-reduce": Program("hpclab.matmul.run_reduce", "matmul"),
    "matmul": Program("hpclab.matmul.run_matmul", "matmul", unit="N"),
    "pi-nccl-node": Program("hpclab.comm.run_pi_nccl_node", "comm"),
    "pi-nccl-mpi": Program("hpclab.comm.run_pi_nccl_mpi", "comm"),
    "conv-halo": Program("hpclab.halo.run", "conv"),
    "ddp-mlp": Program("hpclab.ddp.run_mlp", "ddp"),
    "ddp-digits": Program("hpclab.ddp.run_digits", "ddp"),
}
