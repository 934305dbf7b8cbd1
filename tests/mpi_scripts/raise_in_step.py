"""Rank 1 of N fails inside a collective step; every rank must report it."""
import sys

from hpclab.errors import RankError, step
from hpclab.mpi import world

comm = world()
try:
    with step(comm, "reading the input"):
        if comm.rank == 1:
            raise FileNotFoundError("input.dat is missing on rank 1")
    comm.Barrier()      # without the step, ranks 0 and 2 would wait here forever
except RankError as exc:
    print(f"rank {comm.rank} caught: {exc}", flush=True)
    sys.exit(3)
print(f"rank {comm.rank} went on")
