"""Is a rank's compute slower inside a coupled multi-GPU run, and why? Under mpirun, one rank per GPU:

    mpirun -n 4 python3 benchmarks/conv/compute_probe.py [rows_per_rank [in_channels out_channels width]]

The same rows of the scaling layer (96 -> 256, 5x5 pad 2, width 256) are
computed in several conditions; per condition the GPU's own time (CUDA
events around the kernels on the compute stream) and the host's wall time,
medians of 5, barrier before each. Conditions:
  own       a working buffer shaped as on one rank (no halo rows), nothing exchanged before
  band      the working buffer of this rank's band in the coupled run (halo rows included)
  band+mpi  the band, right after a host-staged halo exchange
  band+nccl the band, right after a NCCL halo exchange
  own+nccl  the one-rank buffer, right after a NCCL halo exchange
  copy own  (not a compute) the copy of this rank's rows into the working buffer
and, for band+nccl, the GPU time of each chunk (im2col + GEMM + scatter).
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
from hpclab.halo.geometry import plan_bands  # noqa: E402
from hpclab.halo.bands import hash_fill  # noqa: E402

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
cin, cout, width = (int(a) for a in sys.argv[2:5]) if len(sys.argv) > 4 else (96, 256, 256)   # small: a dry run
size, rank = comm.size, comm.rank
rng = np.random.default_rng(1)
layer = ex.Conv("big", rng.uniform(-0.1, 0.1, (cout, cin, 5, 5)).astype(np.float32), np.zeros(cout, np.float32),
                1, 2, relu=True, method="gemm")
cu = backend.cuda()
height = rows * size
r0, r1 = hcomm.block_range(height, size, rank)
x = hash_fill((1, cin, r1 - r0, width), 5, r0, height)
host_mpi = hcomm.get("mpi-host", comm)
nccl = host_mpi if backend.is_simulator() else hcomm.get("nccl", comm, quiet=True)  # sim: a dry run
stream, how = compute_stream()
edge, edge_how = edge_stream()
p = plan_bands(height, 5, 1, 2, size)[rank]
bufs = ex.Buffers()
own_work = bufs.get("own-work", (1, cin, r1 - r0, width))
band_work = bufs.get("band-work", (1, cin, p.have[1] - p.have[0], width))
out = bufs.get("out", (1, cout, r1 - r0, width))
cu.synchronize()
CHUNK = 197   # the GEMM path's rows per chunk for this layer (512 MiB of buffers)


def exchange(be):
    rounds = ex.pack_halos(plan_bands(height, 5, 1, 2, size), x, rank, edge,
                           lambda nm, sh: bufs.get(f"x-{nm}", sh))
    ex.exchange_packed(be, rounds, edge)


def compute(work, pad_top, per_chunk=None):
    """GPU seconds (events) and wall seconds of all rows of the band."""
    start, end = cu.event(), cu.event()
    marks = []
    t = time.perf_counter()
    start.record(stream)
    if per_chunk is None:
        layer.device_rows(work, out, pad_top, 0, r1 - r0, stream, bufs.gemm)
    else:
        for j in range(0, r1 - r0, CHUNK):
            ev = cu.event()
            layer.device_rows(work, out, pad_top, j, min(j + CHUNK, r1 - r0), stream, bufs.gemm)
            ev.record(stream)
            marks.append(ev)
    end.record(stream)
    end.synchronize()
    wall = time.perf_counter() - t
    if per_chunk is not None:
        prev = start
        for ev in marks:
            per_chunk.append(prev.elapsed_time(ev) / 1e3)
            prev = ev
    return start.elapsed_time(end) / 1e3, wall


def copy_own():
    """GPU and wall seconds of copying the own rows into the working buffer (what run_device does first)."""
    from hpclab.halo.bands import copy_rows

    start, end = cu.event(), cu.event()
    t = time.perf_counter()
    start.record(stream)
    copy_rows(x, 0, band_work, p.local[0] - p.have[0], r1 - r0, stream)
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3, time.perf_counter() - t


conditions = {
    "copy own": copy_own,
    "own": lambda: compute(own_work, 2),
    "band": lambda: compute(band_work, p.pad_top),
    "band+mpi": lambda: (exchange(host_mpi), compute(band_work, p.pad_top))[1],
    "band+nccl": lambda: (exchange(nccl), compute(band_work, p.pad_top))[1],
    "own+nccl": lambda: (exchange(nccl), compute(own_work, 2))[1],
}
samples = {k: [] for k in conditions}
for rep in range(7):
    for name, fn in conditions.items():
        comm.Barrier()
        gpu, wall = fn()
        if rep >= 2:
            samples[name].append((gpu, wall))
chunks: list = []
comm.Barrier()
exchange(nccl)
compute(band_work, p.pad_top, chunks)
results = {k: (statistics.median(g for g, _ in v), statistics.median(w for _, w in v)) for k, v in samples.items()}
everyone = comm.gather((results, chunks))
if rank == 0:
    print(f"rows per rank {rows}, {size} ranks, compute stream {how}, edge stream {edge_how}; GPU s / wall s per rank")
    for key in conditions:
        print(f"  {key:<10}" + "  ".join(f"{r[key][0]:.4f}/{r[key][1]:.4f}" for r, _ in everyone))
    print("  band+nccl per chunk, GPU ms min/median/max (sum):")
    for i, (_, ch) in enumerate(everyone):
        ms = [c * 1e3 for c in ch]
        print(f"    rank {i}: {min(ms):.3f}/{statistics.median(ms):.3f}/{max(ms):.3f} ({sum(ms):.1f})"
              f"  first 4: {' '.join(f'{m:.2f}' for m in ms[:4])}")
