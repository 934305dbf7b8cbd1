"""What every communication backend offers, and the checks they share.

The operations are MPI's, under its names: ``allreduce``, ``reduce``, ``bcast``, ``scatter``, ``gather``,
``allgather``, ``reduce_scatter`` and ``sendrecv``, on Numba device arrays (NumPy arrays are copied to the
device first), returning device arrays; ``op`` is ``"sum"``, ``"max"`` or ``"min"``. ``allreduce(buf,
op, out=None, check=True)``: ``check=False`` skips the cross-rank check, for loops that checked their buffers once.
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

    def to_device(self, buf):
        return buf if hasattr(buf, "copy_to_host") else self.cuda.to_device(np.ascontiguousarray(buf))

    def prepared(self, buf, what: str, op: str | None = None, divisible: bool = False,
                 out=None, check: bool = True):
        """``buf`` on the device, checked for the collective ``what`` on every rank: a known
        reduction ``op``; the same shape and dtype everywhere (unless ``check`` is False);
        a first dimension that divides among the ranks (``divisible``)."""
        buf = self.to_device(buf)
        if op is not None and op not in OPS:
            raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(OPS)}")
        if check:
            self.check_same(buf, what, out)
        if divisible and buf.shape[0] % self.size:
            raise ValueError(f"{what}: the first dimension ({buf.shape[0]}) does not divide among "
                             f"{self.size} ranks; pad it to a multiple of {self.size}.")
        return buf

    def check_same(self, buf, what: str, out=None) -> None:
        """Every rank must pass the same shape and dtype (and an ``out`` like ``buf``): find out
        before the collective (a mismatch there is a hang or garbage) and name the rank. One small
        ``allgather``: cheap, but not free, so hot loops check once and then pass ``check=False``."""
        mine = (tuple(buf.shape), np.dtype(buf.dtype).str, self.local_problem(buf, out))
        everyone = self.comm.allgather(mine)
        ref_shape, ref_dtype = everyone[0][:2]
        bad = {}
        for r, (shape, dtype, problem) in enumerate(everyone):
            if problem:
                bad[r] = problem
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

    def describe(self) -> str:
        return self.name

    def allreduce_enqueue(self, buf, out, stream) -> bool:
        """Sum ``buf`` over ranks into ``out`` (same shape, on the device), ordered on ``stream``, unchecked
        (for buffers checked once: gradient buckets). NCCL enqueues it there and returns True at once; here
        (MPI) it runs to completion now and returns False."""
        self.allreduce(buf, op="sum", out=out, check=False)
        return False

    def synchronize(self) -> None:
        self.cuda.synchronize()

    def release(self) -> None:
        """Free buffers kept for reuse (staging buffers, for example)."""
