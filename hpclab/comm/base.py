"""What every communication backend offers, and the checks they share.

All operations take Numba device arrays (or NumPy arrays, which are copied
to the device first) and return device arrays. Operations are named after
MPI's and behave like them; ``op`` is ``"sum"``, ``"max"`` or ``"min"``.
"""
from __future__ import annotations

import numpy as np

from hpclab import backend
from hpclab.mpi import world
from hpclab.errors import RankError

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

    def prepared(self, buf, what: str, op: str | None = None, divisible: bool = False,
                 out=None, check: bool = True):
        """``buf`` on the device, checked for the collective ``what`` on every rank: a known
        reduction ``op``; the same shape and dtype everywhere (unless ``check`` is False);
        a first dimension that divides among the ranks (``divisible``)."""
        buf = self.to_device(buf)
        if op is not None:
            self.check_op(op)
        if check:
            self.check_same(buf, what, out)
        if divisible:
            self.check_divisible(buf, what)
        return buf

    def check_same(self, buf, what: str, out=None) -> None:
        """Every rank must pass the same shape and dtype: find out before the
        collective (a mismatch there is a hang or garbage) and name the rank.

        One small ``allgather`` of (shape, dtype, local problem): cheap, but not
        free, so hot loops check once and then call with ``check=False``.
        ``out``, when given, must match ``buf`` on every rank too.
        """
        problem = self.local_problem(buf, out)
        mine = (tuple(buf.shape), np.dtype(buf.dtype).str, problem)
        everyone = self.comm.allgather(mine)
        ref_shape, ref_dtype = everyone[0][0], everyone[0][1]
        bad = {}
        for r, (shape, dtype, prob) in enumerate(everyone):
            if prob:
                bad[r] = prob
            elif (shape, dtype) != (ref_shape, ref_dtype):
                bad[r] = (f"buffer {shape} {np.dtype(dtype).name} but rank 0 has {ref_shape} "
                          f"{np.dtype(ref_dtype).name}; pass the same shape and dtype on every rank")
        if bad:
            raise RankError(f"{self.name} {what}", bad, self.size)

    def local_problem(self, buf, out=None) -> str | None:
        """What is wrong with this rank's buffers on their own (None if nothing)."""
        if out is not None and (tuple(out.shape) != tuple(buf.shape) or out.dtype != buf.dtype):
            return (f"out has {tuple(out.shape)} {np.dtype(out.dtype).name} but the buffer has "
                    f"{tuple(buf.shape)} {np.dtype(buf.dtype).name}; allocate out like the buffer")
        return None

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
    def allreduce(self, buf, op="sum", out=None, check=True):
        """Reduce over ranks; every rank gets the result (a new device array,
        or ``out`` when given). ``check=False`` skips the cross-rank shape
        check, for loops that already checked these buffers once."""
        raise NotImplementedError

    def allreduce_enqueue(self, buf, out, stream) -> bool:
        """Sum ``buf`` over ranks into ``out`` (same shape, on the device), ordered on ``stream``.

        A backend that can enqueue the collective on a CUDA stream (NCCL) does so
        and returns at once with True: the result is there when the stream gets
        past it. Here (MPI), it runs to completion now and returns False. No checks:
        for loops that checked their buffers once (data-parallel gradient buckets).
        """
        self.allreduce(buf, op="sum", out=out, check=False)
        return False

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

    def sendrecv(self, sendbuf, dest, source, recvbuf=None, stream=0):
        raise NotImplementedError

    def synchronize(self) -> None:
        self.cuda.synchronize()

    def release(self) -> None:
        """Free buffers kept for reuse (staging buffers, for example)."""
