"""Which notebook owns this engine: runs on the engines (ipyparallel has no notion of an owner).

An engine handles one request at a time, so a claim is atomic per engine. Claiming and releasing empty
the namespace: no name of one notebook reaches the next.
"""
from __future__ import annotations

import gc
import os
import socket
import sys

_owner: dict | None = None


def owner() -> dict | None:
    return _owner


def claim(record: dict, takeover: tuple[str, ...] = ()) -> dict | None:
    """Make ``record`` the owner if the engine is free, held by the same token, or held by one of the
    ``takeover`` tokens (owners known to be gone). None when claimed, else the owner that holds it."""
    global _owner
    held = _owner
    if held is not None and held["token"] != record["token"] and held["token"] not in takeover:
        return held
    _owner = dict(record)
    if held is None or held["token"] != record["token"]:
        reset_namespace()
    return None


def release(token: str) -> bool:
    """Give the engine back (only its owner can); its namespace is emptied."""
    global _owner
    if _owner is None or _owner["token"] != token:
        return False
    _owner = None
    reset_namespace()
    return True


def reset_namespace() -> None:
    """Forget every name a notebook defined here, and free what they held (device arrays too)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.reset(new_session=False)
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None:  # the names ipyparallel's MPI engines start with
            shell.user_ns.update(MPI=mpi, mpi_rank=mpi.COMM_WORLD.Get_rank(), mpi_size=mpi.COMM_WORLD.Get_size())
    gc.collect()


def describe() -> dict:
    """This engine's MPI rank and size, process, host and owner."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return {"rank": comm.rank, "size": comm.size, "pid": os.getpid(), "host": socket.gethostname(), "owner": _owner}
