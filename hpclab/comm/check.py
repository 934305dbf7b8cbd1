"""Checks for notebook 05: the NCCL bootstrap written by the learner (rank 0's unique id, broadcast
over MPI; every rank's communicator made with (number of ranks, that id, its rank)).

On GPUs the function gets :class:`GuardedNccl`: CuPy's NCCL, except that creating a communicator first
compares the id every rank brings and raises on every rank where they differ, instead of waiting forever in
NCCL for ranks that never come (the likeliest wrong answer: every rank calling ``get_unique_id()``); the
communicator it returns must then all-reduce correctly. Where NCCL cannot run (the simulator; ranks sharing
a GPU) the function gets :class:`StandInNccl`, which offers the same two calls and records them, so the
check still judges the bootstrap itself.
"""
from __future__ import annotations

import os
from collections import namedtuple

import numpy as np

from hpclab import backend
from hpclab.comm.nccl import NEEDS_OWN_GPU, load, pointer
from hpclab.device import describe_sharing, sharing
from hpclab.verdict import Verdict, say as _say

ID_BYTES = 128


# What the stand-in's NcclCommunicator returns: the arguments it was given.
StandInCommunicator = namedtuple("StandInCommunicator", "nranks uid rank")


class Recording:
    """An NCCL module for the exercise that counts the ids it makes and records the communicators asked for."""

    def __init__(self):
        self.ids_made = 0
        self.communicators: list[tuple] = []


class StandInNccl(Recording):
    """What the bootstrap needs of ``cupy.cuda.nccl``, recording every call. ``get_unique_id`` returns
    128 random signed bytes, a different id on every call and in every process, as NCCL's does."""

    def __init__(self, reason: str = "the Numba CUDA simulator has no NCCL"):
        super().__init__()
        self.reason = reason          # why the real NCCL is not used here, in words

    def get_unique_id(self) -> tuple:
        self.ids_made += 1
        return tuple(int(b) - 128 for b in os.urandom(ID_BYTES))

    def NcclCommunicator(self, nranks, uid, rank):  # noqa: N802 - the name CuPy uses
        self.communicators.append((nranks, tuple(uid), rank))
        return StandInCommunicator(nranks, tuple(uid), rank)


class GuardedNccl(Recording):
    """``cupy.cuda.nccl`` that records the bootstrap's calls, and whose ``NcclCommunicator`` first gathers
    every rank's (ranks, id, rank) over MPI: where they do not make one communicator it raises on every rank,
    naming the mistake, before NCCL is touched (NCCL would wait forever). Everything else is CuPy's."""

    def __init__(self, nccl, comm):
        super().__init__()
        self._nccl, self._comm = nccl, comm

    def __getattr__(self, name):
        return getattr(self._nccl, name)

    def get_unique_id(self):
        self.ids_made += 1
        return self._nccl.get_unique_id()

    def NcclCommunicator(self, nranks, uid, rank):  # noqa: N802 - the name CuPy uses
        self.communicators.append((nranks, tuple(uid), rank))
        everyone = self._comm.allgather((nranks, tuple(uid), rank))
        differ = [r for r, (_, u, _) in enumerate(everyone) if u != everyone[0][1]]
        if differ:
            raise RuntimeError(f"NcclCommunicator would wait forever: ranks {differ} brought another id than rank "
                               "0's. Only rank 0 calls get_unique_id(); the others receive its id with "
                               "comm.bcast(uid, root=0)")
        wrong = [(r, n, k) for r, (n, _, k) in enumerate(everyone) if (n, k) != (self._comm.size, r)]
        if wrong:
            r, n, k = wrong[0]
            raise RuntimeError(f"NcclCommunicator would wait forever: rank {r} asked for ({n} ranks, rank {k}); "
                               f"each rank asks for (comm.size, uid, comm.rank), here ({self._comm.size}, uid, {r})")
        return self._nccl.NcclCommunicator(nranks, uid, rank)


def nccl_module(comm=None):
    """``cupy.cuda.nccl`` with one GPU per rank (when it imports), guarded against a bootstrap that would hang,
    else a recording stand-in whose ``reason`` says why. Collective (it asks every rank of ``comm`` which GPU
    it uses)."""
    if backend.is_simulator():
        return StandInNccl()
    shared = sharing(comm)
    if shared:
        return StandInNccl(f"{describe_sharing(shared)}, and {NEEDS_OWN_GPU}")
    return GuardedNccl(load(), comm)


def bootstrap(fn, comm, nccl, quiet: bool | None = None) -> Verdict:
    """Run ``fn(comm, nccl) -> (unique id, communicator)`` on every rank and judge it, ``nccl`` from
    :func:`nccl_module` (collective: the verdict is the same on every rank; rank 0 prints it)."""
    quiet = comm.rank != 0 if quiet is None else quiet
    error, uid, nccomm = None, None, None
    try:
        uid, nccomm = fn(comm, nccl)
    except Exception as exc:  # noqa: BLE001 - reported as the verdict, on every rank
        error = f"{type(exc).__name__}: {exc}"
    errors = comm.allgather(error)
    if any(errors):
        bad = next(r for r, e in enumerate(errors) if e)
        return _say(Verdict(False, f"rank {bad} raised {errors[bad]}"), quiet)
    mine = {
        # CuPy gives the id as a tuple of 128 ints or as 128 bytes, by version.
        "uid": tuple(uid) if isinstance(uid, (tuple, list, bytes, bytearray)) else repr(uid),
        "ids_made": nccl.ids_made,
        "made": nccl.communicators,
    }
    verdict = _judge(comm.allgather(mine), comm.size)
    if verdict and isinstance(nccl, GuardedNccl):
        verdict = _reduce_with(nccomm, comm)
    return _say(verdict, quiet)


def _judge(everyone: list[dict], size: int) -> Verdict:
    for r, e in enumerate(everyone):
        if not isinstance(e["uid"], tuple) or len(e["uid"]) != ID_BYTES:
            return Verdict(False, f"rank {r} returned {str(e['uid'])[:60]} as the id; return the "
                                  f"{ID_BYTES}-byte id that nccl.get_unique_id() gives")
    first = everyone[0]["uid"]
    differ = [r for r, e in enumerate(everyone) if e["uid"] != first]
    makers = [r for r, e in enumerate(everyone) if e["ids_made"]]
    if makers != [0] or everyone[0]["ids_made"] != 1:
        return Verdict(False, f"ranks {makers} asked NCCL for an id "
                              f"({[e['ids_made'] for e in everyone]} calls per rank): only rank 0 "
                              "should call get_unique_id(), once; the others receive its id over MPI")
    if differ:
        return Verdict(False, f"ranks {differ} hold a different id from rank 0's: broadcast rank 0's "
                              "id with comm.bcast(uid, root=0) and use what it returns")
    for r, e in enumerate(everyone):
        if e["made"] != [(size, first, r)]:
            made = ", ".join(f"NcclCommunicator({n}, {'the id' if u == first else 'another id'}, {k})"
                             for n, u, k in e["made"]) or "no communicator"
            return Verdict(False, f"rank {r} created {made}; each rank creates exactly one: "
                                  f"NcclCommunicator(comm.size, uid, comm.rank), here ({size}, uid, {r})")
    return Verdict(True, f"all {size} ranks hold rank 0's NCCL id and made their communicator with "
                         f"(nranks={size}, id, rank)")


def _reduce_with(nccomm, comm) -> Verdict:
    """On GPUs: the communicator must span the ranks, sit on this rank's GPU, and all-reduce."""
    from cupy.cuda import nccl, runtime

    cuda = backend.cuda()
    facts = (nccomm.size(), nccomm.rank_id(), nccomm.device_id(), cuda.get_current_device().id)
    buf = cuda.to_device(np.array([comm.rank + 1.0]))
    nccomm.allReduce(pointer(buf), pointer(buf), 1, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, 0)
    runtime.streamSynchronize(0)
    got = float(buf.copy_to_host()[0])
    everyone = comm.allgather((facts, got))
    comm.Barrier()
    nccomm.destroy()  # every rank, same moment: NCCL's destroy may wait for the others
    expected = comm.size * (comm.size + 1) / 2
    for r, ((size, rank, dev, mine), total) in enumerate(everyone):
        if size != comm.size or rank != r:
            return Verdict(False, f"rank {r}'s communicator has {size} ranks and calls itself rank {rank}")
        if dev != mine:
            return Verdict(False, f"rank {r}'s communicator is on GPU {dev} but the rank uses GPU {mine}: "
                                  "create it after selecting the GPU")
        if total != expected:
            return Verdict(False, f"an NCCL all-reduce of [rank + 1] gave {total} on rank {r}, not {expected}")
    return Verdict(True, f"the communicators span {comm.size} ranks, one per GPU, and all-reduce "
                         f"[rank + 1] to {expected:g}")
