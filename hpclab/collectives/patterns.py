"""Workshop Exercise 0 on GPU data: the eight communication patterns applied to each rank's [rank + 1]."""
from __future__ import annotations

from hpclab.collectives.kernels import fill


def exercise0(be) -> dict[str, list[float]]:
    """What this rank holds after each pattern through backend ``be`` on its device array [rank + 1] (host
    copies, for checking). Rooted ones use root 0; Scatter sends 10, 20, ...; ReduceScatter's rank r
    gives (r + 1) [1, 2, ..., N]."""
    rank, size = be.rank, be.size
    mine = fill(1, rank + 1.0)                                    # GPU r holds [r + 1]
    held = {}
    right, left = (rank + 1) % size, (rank - 1) % size
    held["sendrecv"] = be.sendrecv(mine, dest=right, source=left).copy_to_host()
    held["bcast"] = be.bcast(fill(1, rank + 1.0), root=0).copy_to_host()
    held["scatter"] = be.scatter(fill(size, 10.0, 10.0), root=0).copy_to_host()
    gathered = be.gather(mine, root=0)
    held["gather"] = (gathered if gathered is not None else mine).copy_to_host()
    held["reduce"] = be.reduce(mine, root=0).copy_to_host()
    held["allreduce"] = be.allreduce(mine).copy_to_host()
    held["allgather"] = be.allgather(mine).copy_to_host()
    held["reduce_scatter"] = be.reduce_scatter(fill(size, rank + 1.0, rank + 1.0)).copy_to_host()
    return {k: v.tolist() for k, v in held.items()}
