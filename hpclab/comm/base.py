"""What every communication backend offers, and the checks they share.

All operations take Numba device arrays (or NumPy arrays, which are copied
to the device first) and return device arrays. Operations are named after
MPI's and behave like them; ``op`` is ``"sum"``, ``"max"`` or ``"min"``.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..mpi import world
from .errors import RankError

OPS = ("sum", "max", "min")


class Backend:
    name = "base"

    def __init__(self, comm=None):
        self.comm = comm or world()
        self.rank = self.comm.rank
        self.size = self.comm.size
        self.cuda = backend.cuda()

    # -- helpers shared by the backends ------------------------------------
    def to_device(self, buf):
        return buf if hasattr(buf, "copy_to_host") else self.cuda.to_device(np.ascontiguousarray(buf))

    def check_same(self, buf, what: str) -> None:
        """Every rank must pass the same shape and dtype: find out before the
        collective (a mismatch there is a hang or garbage) and name the rank."""
        mine = (tuple(buf.shape), np.dtype(buf.dtype).str)
        everyone = self.comm.allgather(mine)
        if any(e != everyone[0] for e in everyone):
            bad = {r: f"buffer {e[0]} {np.dtype(e[1]).name} but rank 0 has {everyone[0][0]} "
                      f"{np.dtype(everyone[0][1]).name}"
                   for r, e in enumerate(everyone) if e != everyone[0]}
            raise RankError(f"{self.name} {what}", bad, self.size)

    def check_divisible(self, buf, what: str) -> None:
        if buf.shape[0] % self.size:
            raise ValueError(
                f"{what}: the first dimension ({buf.shape[0]}) does not divide among "
                f"{self.size} ranks; pad it to a multiple of {self.size}.")

    @staticmethod
    def check_op(op: str) -> str:
        if op not in OPS:
            raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(OPS)}")
        return op

    def describe(self) -> str:
        return self.name

    # -- the API ------------------------------------------------------------
    def allreduce(self, buf, op="sum"):
        raise NotImplementedError

    def reduce(self, buf, root=0, op="sum"):
        raise NotImplementedError

    def bcast(self, buf, root=0):
        raise NotImplementedError

    def scatter(self, buf, root=0):
        raise NotImplementedError

    def gather(self, buf, root=0):
        raise NotImplementedError

    def allgather(self, buf):
        raise NotImplementedError

    def reduce_scatter(self, buf, op="sum"):
        raise NotImplementedError

    def sendrecv(self, sendbuf, dest, source, recvbuf=None):
        raise NotImplementedError

    def synchronize(self) -> None:
        self.cuda.synchronize()
