"""Where does a rank's time go in the halo-exchange layer? Run under mpirun, one rank per GPU:

    mpirun -n 4 python3 benchmarks/conv/phase_probe.py [rows_per_rank]

Per rank, median of 5 runs of the scaling layer (96 -> 256, 5x5, width 256):
  self      the band alone on MPI.COMM_SELF (no exchange), inside this MPI job
  overlap   the benchmark's run: interior queued, halos exchanged, boundary rows beside it
  serial    exchange first, then all rows (no overlap)
  split     the synchronised pass that splits the time into compute and halo
and for the overlapped run the host's time in the exchange and to queue the interior kernels.
"""
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from hpclab import backend, comm as hcomm
from hpclab.device import select_gpu
from hpclab.mpi import world

backend.select()
comm = world()
select_gpu(comm)
from hpclab.halo import executors as ex  # noqa: E402
from hpclab.halo.streams import compute_stream, edge_stream  # noqa: E402
from hpclab.halo.bands import hash_fill  # noqa: E402

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
size, rank = comm.size, comm.rank
rng = np.random.default_rng(1)
layer = ex.Conv("big", rng.uniform(-0.1, 0.1, (256, 96, 5, 5)).astype(np.float32), np.zeros(256, np.float32),
                1, 2, relu=True, method="gemm")
cu = backend.cuda()
height = rows * size
r0, r1 = hcomm.block_range(height, size, rank)
x = hash_fill((1, 96, r1 - r0, 256), 5, r0, height)
host_mpi = hcomm.get("mpi-host", comm)
self_mpi = hcomm.get("mpi-host", MPI.COMM_SELF, quiet=True)
nccl = hcomm.get("nccl", comm, quiet=True)
cu.synchronize()


def timed(fn, repeats=5, warmup=2):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


bufs = {k: ex.Buffers() for k in ("self", "host", "nccl")}
results = {
    "self": timed(lambda: ex.run_device([layer], x, MPI.COMM_SELF, self_mpi, True, None, bufs["self"], r1 - r0)),
    "overlap mpi-host": timed(lambda: ex.run_device([layer], x, comm, host_mpi, True, None, bufs["host"], height)),
    "overlap nccl": timed(lambda: ex.run_device([layer], x, comm, nccl, True, None, bufs["nccl"], height)),
    "serial mpi-host": timed(lambda: ex.run_device([layer], x, comm, host_mpi, False, None, bufs["host"], height)),
}
t = ex.Timer()
ex.run_device([layer], x, comm, nccl, True, t, bufs["nccl"], height)
results["host in exchange (nccl)"] = t.seconds.get("halo", 0)   # from interior queued to halo unpacked
for be_name, be in (("mpi-host", host_mpi), ("nccl", nccl)):
    t = ex.Timer(sync=True)
    ex.run_device([layer], x, comm, be, True, t, bufs["host"], height)
    for phase in ("compute", "halo"):
        results[f"split {be_name}: {phase}"] = t.seconds.get(phase, 0.0)
# The interior's kernels alone: how long the host takes to queue them, then the GPU to finish.
stream, _ = compute_stream()
work = bufs["self"].get("0-work", x.shape)
out = bufs["self"].get("0-out", (1, 256, r1 - r0, 256))
stream.synchronize()
t0 = time.perf_counter()
layer.device_rows(work, out, 2, 0, r1 - r0, stream, bufs["self"].gemm)
t1 = time.perf_counter()
stream.synchronize()
results["queue interior (host)"] = t1 - t0
results["queue + run interior"] = time.perf_counter() - t0
results["self, again at the end"] = timed(
    lambda: ex.run_device([layer], x, MPI.COMM_SELF, self_mpi, True, None, bufs["self"], r1 - r0))
everyone = comm.gather(results)
if rank == 0:
    print(f"rows per rank {rows}, {size} ranks: seconds per rank; compute stream: {compute_stream()[1]}")
    for key in results:
        print(f"  {key:<28}" + " ".join(f"{r[key]:.4f}" for r in everyone))
