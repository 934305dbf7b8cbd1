"""Rank 1 fails outside any step inside a program: the runner must abort all ranks."""
from hpclab.mpi import world

comm = world()
if comm.rank == 1:
    raise RuntimeError("rank 1 crashed")
comm.Barrier()
