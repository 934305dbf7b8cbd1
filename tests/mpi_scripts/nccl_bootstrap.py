"""The notebook-05 bootstrap check on right and wrong answers (run under mpiexec).

    mpiexec -n 3 python tests/mpi_scripts/nccl_bootstrap.py   -> one JSON line on rank 0
"""
import json

import hpclab  # noqa: F401
from hpclab.comm import check
from hpclab.mpi import world


def right(comm, nccl):
    uid = nccl.get_unique_id() if comm.rank == 0 else None
    uid = comm.bcast(uid, root=0)
    return uid, nccl.NcclCommunicator(comm.size, uid, comm.rank)


def own_ids(comm, nccl):  # every rank makes its own id: the ids differ
    uid = nccl.get_unique_id()
    return uid, nccl.NcclCommunicator(comm.size, uid, comm.rank)


def not_broadcast(comm, nccl):  # rank 0 makes the id, but nobody receives it
    uid = nccl.get_unique_id() if comm.rank == 0 else tuple([0] * 128)
    return uid, nccl.NcclCommunicator(comm.size, uid, comm.rank)


def wrong_rank(comm, nccl):
    uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None, root=0)
    return uid, nccl.NcclCommunicator(comm.size, uid, 0)


class BytesIds(check.StandInNccl):
    """NCCL as the CuPy versions that give the id as 128 bytes rather than a tuple."""

    def get_unique_id(self):
        return bytes(b % 256 for b in super().get_unique_id())


comm = world()
verdicts = {f.__name__: check.bootstrap(f, comm, check.nccl_module(), quiet=True)
            for f in (right, own_ids, not_broadcast, wrong_rank)}
verdicts["right_bytes"] = check.bootstrap(right, comm, BytesIds(), quiet=True)
# What a GPU run hands the learner: NCCL guarded against a bootstrap that would wait forever (here around a
# stand-in, which must never be asked for a communicator by a wrong bootstrap).
for f in (own_ids, not_broadcast, wrong_rank):
    inner = check.StandInNccl()
    verdicts[f"guarded_{f.__name__}"] = check.bootstrap(f, comm, check.GuardedNccl(inner, comm), quiet=True)
    verdicts[f"guarded_{f.__name__}_reached_nccl"] = check.Verdict(bool(inner.communicators), "")
if comm.rank == 0:
    print(json.dumps({k: [v.ok, v.message] for k, v in verdicts.items()}))
