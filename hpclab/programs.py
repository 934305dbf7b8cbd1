"""The names ``hpclab run`` and ``hpclab scaling`` know, each the module of a program (docs/architecture.md,
*Programs are modules*)."""
from __future__ import annotations

import importlib

from hpclab.options import UsageError

PROGRAMS = {
    "collectives": "hpclab.collectives.run",
    "pi-midpoint": "hpclab.pi.run_midpoint",
    "pi-mc": "hpclab.pi.run_mc",
    "matmul-reduce": "hpclab.matmul.run_reduce",
    "matmul": "hpclab.matmul.run_matmul",
    "pi-nccl-node": "hpclab.comm.run_pi_nccl_node",
    "pi-nccl-mpi": "hpclab.comm.run_pi_nccl_mpi",
    "conv-halo": "hpclab.halo.run",
    "ddp-mlp": "hpclab.ddp.run_mlp",
    "ddp-digits": "hpclab.ddp.run_digits",
}


def load(name: str):
    """The module of the program ``name``."""
    if name not in PROGRAMS:
        raise UsageError(f"hpclab run: error: unknown program {name!r}; choose one of: {', '.join(sorted(PROGRAMS))}")
    return importlib.import_module(PROGRAMS[name])
