"""Run a chain of layers on height bands, one rank or many: ``run_host`` on CPUs (NumPy bands, halos by
mpi4py ``Isend``/``Irecv`` while the interior is computed: V1, V2), ``run_device`` on GPUs (halos packed by
a kernel and exchanged by a communication backend's ``sendrecv`` on a high-priority stream while the
interior is computed on another: V3, V4, V5). With one rank both are the serial code.

Both add seconds per phase ("compute", "halo") to a :class:`hpclab.timing.Phases`. With
``Phases(sync=True)`` the device executor does not overlap and synchronises at every phase boundary,
so the phases add up to that pass's wall time; otherwise a phase's seconds are the host's time in it.
"""
from __future__ import annotations

import numpy as np

from hpclab.backend import cuda
from hpclab.halo import reference as ref
from hpclab.halo.bands import copy_rows
from hpclab.halo.conv import lrn_device
from hpclab.halo.conv_gemm import Workspace
from hpclab.halo.geometry import plan_bands, schedule, transfers
from hpclab.mpi import MPI
from hpclab.streams import compute_stream, edge_stream, event
from hpclab.timeline import OFF
from hpclab.timing import Phases


def _height(x, comm) -> int:
    """The whole input's height: the sum of the ranks' bands."""
    return comm.allreduce(x.shape[2], op=MPI().SUM) if comm.size > 1 else x.shape[2]


def run_host(ops, x: np.ndarray, comm, overlap: bool = True, phases: Phases | None = None) -> np.ndarray:
    """Forward ``x`` (this rank's input band, (N, C, rows, W)) through ``ops`` on the CPU."""
    phases = phases or Phases(sync=False)
    size, rank = comm.size, comm.rank
    height = _height(x, comm)
    for op in ops:
        if op.window is None:
            with phases("compute"):
                x = ref.lrn(x, op.size, op.alpha, op.beta, op.k)
            continue
        stride = op.window[1]
        with phases("compute"):
            plans = plan_bands(height, *op.window, size)
            p = plans[rank]
            n, c, _, w = x.shape
            work = np.zeros((n, c, p.have[1] - p.have[0], w), dtype=np.float32)
            l0, l1 = p.local
            work[:, :, l0 - p.have[0]:l1 - p.have[0]] = x[:, :, l0 - p.own[0]:l1 - p.own[0]]
            arriving = [(m, np.empty((n, c, m.rows, w), dtype=np.float32)) for m in (*p.above, *p.below)]
            requests = [comm.Irecv(buf, source=m.src, tag=7) for m, buf in arriving]
            requests += [comm.Isend(np.ascontiguousarray(x[:, :, m.start - p.own[0]:m.stop - p.own[0]]), dest=m.dst,
                                    tag=7) for m in transfers(plans) if m.src == rank]
            pieces = {}

            def compute(j0, j1):
                start = (j0 - p.out_rows[0]) * stride - p.pad_top   # first input row, in the working buffer
                pieces[j0] = op.host_rows(work[:, :, max(0, start):], max(0, -start), j1 - j0)

            if overlap and p.interior[1] > p.interior[0]:
                compute(*p.interior)              # while the halo messages travel
        with phases("halo"):
            MPI().Request.Waitall(requests)
            for m, buf in arriving:
                work[:, :, m.start - p.have[0]:m.stop - p.have[0]] = buf
        with phases("compute"):
            for j0, j1 in (p.boundary if overlap else [p.out_rows]):
                compute(j0, j1)
            x = np.concatenate([pieces[k] for k in sorted(pieces)], axis=2)
        height = p.out_height
    return x


class Buffers:
    """Device buffers kept between calls of ``run_device`` (allocation synchronises the GPU): the layers'
    bands, and each stream's GEMM/Winograd scratch. The next call with the same buffers overwrites its output."""

    def __init__(self):
        self.bands, self.compute, self.edge = Workspace(), Workspace(), Workspace()


def pack_halos(plans, x, rank, stream, get):
    """Copy the rows this rank sends into contiguous buffers (``get(name, shape)``), one per round: [(offset,
    send Transfer | None, recv Transfer | None, send buffer, recv buffer)] for the rounds this rank is in."""
    p = plans[rank]
    n, c, _, w = x.shape
    rounds = []
    for offset, pairs in schedule(transfers(plans), len(plans)):
        send, recv = pairs[rank]
        if send is None and recv is None:
            continue
        sbuf = get(f"send{offset}", (n, c, send.rows, w)) if send else get("dummy", (1,))
        if send:
            copy_rows(x, send.start - p.own[0], sbuf, 0, send.rows, stream)
        rbuf = get(f"recv{offset}", (n, c, recv.rows, w)) if recv else get("dummy", (1,))
        rounds.append((offset, send, recv, sbuf, rbuf))
    return rounds


def run_device(ops, x, comm, be=None, overlap: bool = True, phases: Phases | None = None,
               buffers: Buffers | None = None, height: int | None = None, timeline=None):
    """Forward the device band ``x`` (its kernels finished) through ``ops``; returns a device array.

    Per windowed layer (:mod:`hpclab.streams`): the compute stream copies own rows into the working
    buffer, then computes the interior; the edge stream (high priority) packs, exchanges (the host waits
    for it only), unpacks the halo and then computes the boundary rows, beside the interior, not after it,
    and a NCCL transfer does not queue behind it. Without overlap every row is computed after the exchange.
    """
    phases = phases or Phases(sync=False)
    overlap = overlap and not phases.sync
    buffers = buffers or Buffers()
    size, rank = comm.size, comm.rank
    height = height or _height(x, comm)
    stream, _ = compute_stream()
    edge, _ = edge_stream()
    tl = timeline or OFF
    # One rank has nothing to wait for between layers: the host queues them all and waits once, at the end
    # (waiting after each layer would leave the GPU idle while Python launches the next).
    queue = size == 1 and not phases.sync
    in_tile = 1                            # how the rows of x are cut among the ranks: the last layer's tiles
    # Frees deferred: Numba's batched cuMemFree synchronises the whole GPU, which would
    # stall the host mid-layer and undo the overlap.
    with cuda().defer_cleanup():
        for i, op in enumerate(ops):
            get = lambda name, shape: buffers.bands.array(f"{i}-{name}", shape)  # noqa: E731
            if op.window is None:
                with phases("compute"):
                    x = lrn_device(x, op.size, op.alpha, op.beta, op.k, out=get("out", x.shape), stream=stream)
                    if not queue:
                        stream.synchronize()
                continue
            with phases("compute"):                # own rows into the working buffer
                plans = plan_bands(height, *op.window, size, op.tile, in_tile)
                p = plans[rank]
                n, c, _, w = x.shape
                cout, _, wo = op.out_shape(c, height, w)
                o0, o1 = p.out_rows
                out = get("out", (n, cout, o1 - o0, wo))
                if p.have == p.own:                # no halo and every own row needed: read the band itself
                    work = x
                else:
                    work = get("work", (n, c, p.have[1] - p.have[0], w))
                    l0, l1 = p.local
                    with tl.span("own rows", "copy", stream, "compute stream"):
                        copy_rows(x, l0 - p.own[0], work, l0 - p.have[0], l1 - l0, stream)
                own_rows_in = event("own rows in")
                own_rows_in.record(stream)
            with phases("halo"):                   # packing
                with tl.span("pack", "copy", edge, "edge stream"):
                    rounds = pack_halos(plans, x, rank, edge, get) if size > 1 else []
            if overlap and p.interior[1] > p.interior[0]:
                with phases("compute"), tl.span("interior rows", "compute", stream, "compute stream"):
                    op.device_rows(work, out, p.pad_top, p.interior[0] - o0, p.interior[1] - o0, stream,
                                   buffers.compute)        # (phase: launch time only: the kernels run on)
            with phases("halo"):     # each exchange runs behind the packing and returns when its rows have arrived
                with tl.span("halo exchange", "comm", edge, "edge stream"):
                    for offset, send, recv, sbuf, rbuf in rounds:
                        be.sendrecv(sbuf, dest=be.rank + offset if send else MPI().PROC_NULL,
                                    source=be.rank - offset if recv else MPI().PROC_NULL, recvbuf=rbuf, stream=edge)
                with tl.span("unpack", "copy", edge, "edge stream"):
                    for _, _, recv, _, rbuf in rounds:
                        if recv:
                            copy_rows(rbuf, 0, work, recv.start - p.have[0], recv.rows, edge)
            with phases("compute"):
                if overlap:
                    own_rows_in.wait(edge)         # the boundary reads own rows too
                    with tl.span("boundary rows", "compute", edge, "edge stream"):
                        for j0, j1 in p.boundary:
                            op.device_rows(work, out, p.pad_top, j0 - o0, j1 - o0, edge, buffers.edge)
                else:
                    halo_in = event("halo in")
                    halo_in.record(edge)
                    halo_in.wait(stream)
                    with tl.span("all rows", "compute", stream, "compute stream"):
                        op.device_rows(work, out, p.pad_top, 0, o1 - o0, stream, buffers.compute)
                if queue:                          # the next layer's stream work follows the boundary rows
                    boundary_done = event("boundary rows done")
                    boundary_done.record(edge)
                    boundary_done.wait(stream)
                else:
                    edge.synchronize()
                    stream.synchronize()
            x, height, in_tile = out, p.out_height, op.tile
        if queue:
            stream.synchronize()
    return x

