"""Every communication-backend operation against NumPy, on every rank (run under mpiexec).

    mpiexec -n 3 python tests/mpi_scripts/comm_ops.py mpi-host,mpi-cuda      -> one JSON line per backend
    mpiexec -n 2 python tests/mpi_scripts/comm_ops.py mismatch mpi-host      -> rank 1's buffer differs

Used by tests/test_comm.py; on a GPU node it checks nccl the same way.
"""
from __future__ import annotations

import json
import sys

import numpy as np

import hpclab  # noqa: F401 - selects GPU or simulator before numba.cuda loads
from hpclab.errors import RankError
from hpclab.comm import get
from hpclab.device import select_gpu
from hpclab.mpi import world


def rank_data(r: int, rows: int, dtype) -> np.ndarray:
    """Rank r's (rows x 3) block: different on every rank, exact in every dtype used."""
    return (np.arange(rows * 3).reshape(rows, 3) % 7 + 10 * r + 1).astype(dtype)


def check_all(be, comm) -> dict[str, bool]:
    from mpi4py import MPI

    rank, size = comm.rank, comm.size
    cuda = be.cuda
    ok = {}
    for dtype in (np.float64, np.int32, np.float32):
        rows = 2 * size
        mine = rank_data(rank, rows, dtype)
        alls = [rank_data(r, rows, dtype) for r in range(size)]
        tag = np.dtype(dtype).name
        d = cuda.to_device(mine)

        for op, ref in (("sum", np.sum), ("max", np.max), ("min", np.min)):
            got = be.allreduce(d, op=op).copy_to_host()
            ok[f"allreduce-{op}-{tag}"] = np.array_equal(got, ref(alls, axis=0))
        out = cuda.device_array_like(d)
        res = be.allreduce(d, out=out, check=False)
        ok[f"allreduce-out-{tag}"] = res is out and np.array_equal(out.copy_to_host(), np.sum(alls, axis=0))
        ok[f"allreduce-input-unchanged-{tag}"] = np.array_equal(d.copy_to_host(), mine)
        ok[f"allreduce-numpy-input-{tag}"] = np.array_equal(be.allreduce(mine).copy_to_host(), np.sum(alls, axis=0))

        root = size - 1
        got = be.reduce(d, root=root, op="sum").copy_to_host()
        ok[f"reduce-{tag}"] = np.array_equal(got, np.sum(alls, axis=0) if rank == root else mine)

        broot = 1 % size
        got = be.bcast(cuda.to_device(mine), root=broot).copy_to_host()
        ok[f"bcast-{tag}"] = np.array_equal(got, alls[broot])

        whole = rank_data(0, rows, dtype) * 0 + np.arange(rows)[:, None].astype(dtype)  # row i = i
        got = be.scatter(cuda.to_device(whole if rank == 0 else np.zeros_like(whole)), root=0).copy_to_host()
        ok[f"scatter-{tag}"] = np.array_equal(got, whole[2 * rank:2 * rank + 2])

        groot = size - 1
        got = be.gather(d, root=groot)
        ok[f"gather-{tag}"] = (np.array_equal(got.copy_to_host(), np.concatenate(alls)) if rank == groot
                               else got is None)

        ok[f"allgather-{tag}"] = np.array_equal(be.allgather(d).copy_to_host(), np.concatenate(alls))

        got = be.reduce_scatter(d, op="sum").copy_to_host()
        ok[f"reduce_scatter-{tag}"] = np.array_equal(got, np.sum(alls, axis=0)[2 * rank:2 * rank + 2])

        right, left = (rank + 1) % size, (rank - 1) % size
        got = be.sendrecv(d, dest=right, source=left).copy_to_host()
        ok[f"sendrecv-ring-{tag}"] = np.array_equal(got, alls[left])

        # A line, not a ring: the ends have MPI.PROC_NULL neighbours and keep their buffer.
        dest = rank + 1 if rank + 1 < size else MPI.PROC_NULL
        source = rank - 1 if rank > 0 else MPI.PROC_NULL
        keep = np.full_like(mine, -5)
        got = be.sendrecv(d, dest=dest, source=source, recvbuf=cuda.to_device(keep)).copy_to_host()
        ok[f"sendrecv-proc-null-{tag}"] = np.array_equal(got, keep if rank == 0 else alls[rank - 1])

        # Written on the halo executor's high-priority stream and exchanged behind it on that stream.
        from hpclab.streams import edge_stream

        stream, _ = edge_stream()
        src = cuda.device_array_like(d, stream=stream)
        src.copy_to_device(d, stream=stream)
        got = be.sendrecv(src, dest=right, source=left, stream=stream).copy_to_host()
        ok[f"sendrecv-stream-{tag}"] = np.array_equal(got, alls[left])
    # Every rank's verdicts, combined: an op passes only if it passed everywhere.
    return {k: bool(comm.allreduce(bool(v), op=MPI.LAND)) for k, v in ok.items()}


def main(argv: list[str]) -> int:
    comm = world()
    select_gpu(comm)
    if argv[0] == "mismatch":  # rank 1 passes one element more than everyone else
        be = get(argv[1], comm)
        try:
            be.allreduce(np.ones(4 + (comm.rank == 1)))
        except RankError as exc:
            print(f"[rank {comm.rank}] error: {exc}", file=sys.stderr, flush=True)
            return 3
        return 0
    failed = False
    for name in argv[0].split(","):
        be = get(name, comm)
        results = check_all(be, comm)
        failed |= not all(results.values())
        if comm.rank == 0:
            print(json.dumps({"requested": name, "backend": be.name, "ranks": comm.size,
                              "results": results}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
