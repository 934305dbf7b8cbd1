"""Run a chain of layers on height bands: on CPUs (NumPy) or GPUs, one rank or many.

One executor per place the data lives:

- ``run_host``: NumPy bands; halos sent with mpi4py ``Isend``/``Irecv``,
  the interior computed while they travel (V1 with one rank, V2).
- ``run_device``: device bands; halos packed by a kernel and exchanged with
  a communication backend's ``sendrecv`` (host-staged MPI, CUDA-aware MPI or
  NCCL), the interior computed on one CUDA stream meanwhile while the
  exchange and the boundary rows use a second, high-priority one (V3 with
  one rank, V4, V5). ``Timer(sync=True)`` measures the split into
  compute and halo exchange (no overlap, a device sync at each boundary).

Both read the same band geometry (:mod:`hpclab.halo.geometry`), and with one
rank they are the serial code: every version runs the same path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hpclab import backend
from hpclab.halo.geometry import BandPlan, check_ranks, plan_bands, schedule, transfers
from hpclab.halo import reference as ref


# -- layers --------------------------------------------------------------------
@dataclass
class Conv:
    name: str
    w: np.ndarray                 # (K, C, R, S)
    bias: np.ndarray
    stride: int = 1
    pad: int = 0
    relu: bool = True
    method: str | None = None     # "direct" or "gemm" on the GPU; None: the backend's default
    _dev: object = field(default=None, repr=False)

    @property
    def window(self):
        return self.w.shape[2], self.stride, self.pad

    def out_shape(self, c, h, w):
        ho, wo = ref.check_conv((c, h, w), self.w.shape, self.stride, self.pad)
        return self.w.shape[0], ho, wo

    def describe(self) -> str:
        k, c, r, s = self.w.shape
        return f"conv {k}@{c}x{r}x{s}/{self.stride} pad {self.pad}" + (" + ReLU" if self.relu else "")

    def host_rows(self, x, pad_top, rows):
        out = ref.conv2d_rows(x, self.w, self.stride, pad_top, self.pad, rows, self.bias)
        return ref.relu(out) if self.relu else out

    def device_weights(self):
        if self._dev is None:
            from hpclab.halo.conv import prepare_weights

            self._dev = prepare_weights(self.w, self.bias)
        return self._dev

    def device_rows(self, x, out, pad_top, t0, t1, stream, workspace=None):
        from hpclab.halo.conv import check_method, conv_rows_device, default_config, plan_tiles

        wts = self.device_weights()
        method = check_method(self.method)
        # The tile plan depends on the layer only, so every band runs the same kernel.
        plan = plan_tiles(x.shape[1], out.shape[3], wts.s, self.stride, default_config(wts.k)) \
            if method == "direct" else None
        conv_rows_device(x, wts, out, self.stride, pad_top, self.pad, t0, t1, self.relu, plan, stream,
                         method, workspace)


@dataclass
class Pool:
    name: str
    size: int = 3
    stride: int = 2

    @property
    def window(self):
        return self.size, self.stride, 0

    def out_shape(self, c, h, w):
        ref.check_window(h, w, self.size, self.size, self.stride, 0, what="pooling window")
        return c, ref.output_size(h, self.size, self.stride, 0), ref.output_size(w, self.size, self.stride, 0)

    def describe(self) -> str:
        return f"max-pool {self.size}x{self.size}/{self.stride}"

    def host_rows(self, x, pad_top, rows):
        return ref.maxpool_rows(x, self.size, self.stride, pad_top, rows)

    def device_rows(self, x, out, pad_top, t0, t1, stream, workspace=None):
        from hpclab.halo.conv import maxpool_rows_device

        maxpool_rows_device(x, out, self.size, self.stride, pad_top, t0, t1, 0, stream)


@dataclass
class LRN:
    name: str
    size: int = ref.LRN_SIZE
    alpha: float = ref.LRN_ALPHA
    beta: float = ref.LRN_BETA
    k: float = ref.LRN_K
    window = None                  # across channels only: no spatial halo

    def out_shape(self, c, h, w):
        return c, h, w

    def describe(self) -> str:
        return f"LRN size {self.size}, alpha {self.alpha:g}, beta {self.beta:g}, k {self.k:g}"


def shapes(ops, in_shape):
    """(C, H, W) after each op, starting from in_shape."""
    out, cur = [], tuple(in_shape)
    for op in ops:
        cur = op.out_shape(*cur)
        out.append(cur)
    return out


def _rows_ok(ops, in_shape, size: int) -> bool:
    cur = tuple(in_shape)
    for op in ops:
        try:
            nxt = op.out_shape(*cur)
        except ValueError:
            return False
        if op.window is not None and nxt[1] < size:
            return False
        cur = nxt
    return True


def min_chain_height(ops, in_shape, size: int) -> int | None:
    """Smallest input height for which every windowed op has >= size output rows."""
    c, h, w = in_shape
    for height in range(h + 1, 64 * (h + 1) * size + 1):
        if _rows_ok(ops, (c, height, w), size):
            return height
    return None


def check_chain(ops, in_shape, size: int, what: str = "") -> None:
    """Every windowed op needs at least one output row per rank: say which does not."""
    cur = tuple(in_shape)
    for op in ops:
        nxt = op.out_shape(*cur)
        if op.window is not None and nxt[1] < size:
            least = min_chain_height(ops, in_shape, size)
            fix = f", or an input height of at least {least}" if least else ""
            check_ranks(nxt[1], size, f"{what}{op.name} ({op.describe()}, input height {cur[1]})", fix)
        cur = nxt


# -- bands -------------------------------------------------------------------------
def _rows_from(plan: BandPlan, kernel: int, stride: int, t0: int):
    """Where local output row t0 starts reading in the working buffer: (first row, zero rows above)."""
    start = t0 * stride - plan.pad_top
    return max(0, start), max(0, -start)


class Timer:
    """Seconds per phase.

    With ``sync=True`` the device executor waits for the GPU at every phase
    boundary and does not overlap (halo exchange, then compute), so the phases
    add up to the wall time of that pass: this is how the time split is
    measured. Without it, kernels run asynchronously and a phase's seconds
    are only the host's time in it (the overlapped runs report wall time).
    """

    def __init__(self, sync: bool = False):
        self.seconds: dict[str, float] = {}
        self.sync = sync

    def add(self, name: str, dt: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + dt


def _now():
    from mpi4py import MPI

    return MPI.Wtime()


def run_host(ops, x: np.ndarray, comm, overlap: bool = True, timer: Timer | None = None) -> np.ndarray:
    """Forward ``x`` (this rank's input band, (N, C, rows, W)) through ``ops`` on the CPU."""
    from mpi4py import MPI

    timer = timer or Timer()
    size, rank = comm.size, comm.rank
    height = comm.allreduce(x.shape[2], op=MPI.SUM) if size > 1 else x.shape[2]
    for op in ops:
        t = _now()
        if op.window is None:
            x = ref.lrn(x, op.size, op.alpha, op.beta, op.k)
            timer.add("compute", _now() - t)
            continue
        kernel, stride, pad = op.window
        plans = plan_bands(height, kernel, stride, pad, size)
        p = plans[rank]
        n, c, _, w = x.shape
        work = np.zeros((n, c, p.have[1] - p.have[0], w), dtype=np.float32)
        l0, l1 = p.local
        work[:, :, l0 - p.have[0]:l1 - p.have[0]] = x[:, :, l0 - p.own[0]:l1 - p.own[0]]
        requests, arriving = [], []
        for m in transfers(plans):
            if m.dst == rank:
                buf = np.empty((n, c, m.stop - m.start, w), dtype=np.float32)
                requests.append(comm.Irecv(buf, source=m.src, tag=7))
                arriving.append((m, buf))
            if m.src == rank:
                send = np.ascontiguousarray(x[:, :, m.start - p.own[0]:m.stop - p.own[0]])
                requests.append(comm.Isend(send, dest=m.dst, tag=7))
        o0, o1 = p.out_rows
        out = None
        pieces = {}

        def compute(j0, j1):
            a, top = _rows_from(p, kernel, stride, j0 - o0)
            pieces[j0] = op.host_rows(work[:, :, a:], top, j1 - j0)

        timer.add("compute", _now() - t)
        t = _now()
        if overlap and p.interior[1] > p.interior[0]:
            compute(*p.interior)              # while the halo messages travel
        timer.add("compute", _now() - t)
        t = _now()
        MPI.Request.Waitall(requests)
        for m, buf in arriving:
            work[:, :, m.start - p.have[0]:m.stop - p.have[0]] = buf
        timer.add("halo", _now() - t)
        t = _now()
        todo = p.boundary if overlap else [p.out_rows]
        for j0, j1 in todo:
            compute(j0, j1)
        out = np.concatenate([pieces[k] for k in sorted(pieces)], axis=2)
        timer.add("compute", _now() - t)
        x, height = out, p.out_height
    return x


class Buffers:
    """Device buffers kept between calls, by name and shape (allocation synchronises the GPU).

    Pass one to ``run_device`` when the same chain runs many times (timing
    loops); the output it returns is overwritten by the next call.
    """

    def __init__(self):
        self._bufs: dict = {}
        from hpclab.halo.conv_gemm import Workspace

        self.gemm = Workspace()        # the interior's GEMM/Winograd scratch (compute stream)
        self.edge_gemm = Workspace()   # the boundary's, used at the same time (edge stream)

    def get(self, name: str, shape):
        from hpclab.backend import cuda

        key = (name, tuple(shape))
        if key not in self._bufs:
            self._bufs[key] = cuda().device_array(tuple(shape), dtype=np.float32)
        return self._bufs[key]


def _fresh(name, shape):
    from hpclab.backend import cuda

    return cuda().device_array(tuple(shape), dtype=np.float32)


def pack_halos(plans, x, rank, stream, get=_fresh):
    """Copy the rows this rank sends into contiguous buffers, one per exchange round.

    Returns [(offset, send Transfer | None, recv Transfer | None, send buffer, recv buffer)]
    for the rounds this rank takes part in (see :func:`schedule`).
    """
    from hpclab.halo.bands import copy_rows

    p = plans[rank]
    n, c, _, w = x.shape
    rounds = []
    for offset, pairs in schedule(transfers(plans), len(plans)):
        send, recv = pairs[rank]
        if send is None and recv is None:
            continue
        sbuf = get(f"send{offset}", (n, c, send.stop - send.start, w)) if send else get("dummy", (1,))
        if send:
            copy_rows(x, send.start - p.own[0], sbuf, 0, send.stop - send.start, stream)
        rbuf = get(f"recv{offset}", (n, c, recv.stop - recv.start, w)) if recv else get("dummy", (1,))
        rounds.append((offset, send, recv, sbuf, rbuf))
    return rounds


def exchange_packed(be, rounds, stream=0) -> int:
    """Send/receive the packed halo rows through ``be.sendrecv``; returns bytes received.

    ``stream`` is the stream the rows were packed on: each exchange runs
    behind it and returns when its rows have arrived. Every round pairs rank
    r's send to r + offset with its receive from r - offset, so no round can
    deadlock.
    """
    from mpi4py import MPI

    rank, got = be.rank, 0
    for offset, send, recv, sbuf, rbuf in rounds:
        be.sendrecv(sbuf, dest=rank + offset if send else MPI.PROC_NULL,
                    source=rank - offset if recv else MPI.PROC_NULL, recvbuf=rbuf, stream=stream)
        got += rbuf.size * 4 if recv else 0
    return got


def unpack_halos(rounds, work, p, stream) -> None:
    from hpclab.halo.bands import copy_rows

    for _, _, recv, _, rbuf in rounds:
        if recv:
            copy_rows(rbuf, 0, work, recv.start - p.have[0], recv.stop - recv.start, stream)


_EDGE_WORKSPACE = None


def _edge_workspace():
    """Scratch for boundary rows when no Buffers are given (the interior uses the GEMM module's)."""
    global _EDGE_WORKSPACE
    if _EDGE_WORKSPACE is None:
        from hpclab.halo.conv_gemm import Workspace

        _EDGE_WORKSPACE = Workspace()
    return _EDGE_WORKSPACE


def run_device(ops, x, comm, be=None, overlap: bool = True, timer: Timer | None = None,
               buffers: Buffers | None = None, height: int | None = None):
    """Forward the device band ``x`` (complete: its kernels finished) through ``ops``; returns a device array.

    Per windowed layer, on two streams (:mod:`hpclab.halo.streams`):

    - compute stream: copy own rows into the working buffer, then the interior rows;
    - edge stream (high priority): pack the rows to send, exchange them
      (the host waits for this stream only), unpack the halo, and, once
      the own rows are in place, the boundary rows.

    The boundary's kernels thus run beside the interior's instead of after
    them, and a NCCL transfer does not queue behind the interior. Each
    stream has its own GEMM scratch. Convolutions use their op's ``method``
    (im2col + GEMM on a GPU by default), which runs in chunks, so freed SMs
    come often. Without overlap (or with ``Timer(sync=True)``) every row is
    computed after the exchange.
    """
    from mpi4py import MPI

    from hpclab.backend import cuda
    from hpclab.halo.bands import copy_rows
    from hpclab.halo.conv import lrn_device
    from hpclab.halo.streams import compute_stream, edge_stream, event

    timer = timer or Timer()
    sync = timer.sync
    overlap = overlap and not sync
    size, rank = comm.size, comm.rank
    if height is None:
        height = comm.allreduce(x.shape[2], op=MPI.SUM) if size > 1 else x.shape[2]
    stream, _ = compute_stream()
    edge, _ = edge_stream()
    get = buffers.get if buffers is not None else _fresh
    ws = buffers.gemm if buffers is not None else None
    edge_ws = buffers.edge_gemm if buffers is not None else _edge_workspace()
    # Frees deferred: Numba's batched cuMemFree synchronises the whole GPU, which would
    # stall the host mid-layer and undo the overlap.
    with cuda().defer_cleanup():
        for i, op in enumerate(ops):
            t = _now()
            if op.window is None:
                x = lrn_device(x, op.size, op.alpha, op.beta, op.k, out=get(f"{i}-out", x.shape), stream=stream)
                stream.synchronize()
                timer.add("compute", _now() - t)
                continue
            kernel, stride, pad = op.window
            plans = plan_bands(height, kernel, stride, pad, size)
            p = plans[rank]
            n, c, _, w = x.shape
            cout, _, wo = op.out_shape(c, height, w)
            o0, o1 = p.out_rows
            work = get(f"{i}-work", (n, c, p.have[1] - p.have[0], w))
            out = get(f"{i}-out", (n, cout, o1 - o0, wo))
            l0, l1 = p.local
            copy_rows(x, l0 - p.own[0], work, l0 - p.have[0], l1 - l0, stream)
            own_rows_in = event("own rows in")
            own_rows_in.record(stream)
            if sync:
                stream.synchronize()
                timer.add("compute", _now() - t)   # own rows into the working buffer
                t = _now()
            rounds = pack_halos(plans, x, rank, edge, lambda nm, sh: get(f"{i}-{nm}", sh)) if size > 1 else []
            if sync:
                edge.synchronize()
                timer.add("halo", _now() - t)      # packing
                t = _now()
            if overlap and p.interior[1] > p.interior[0]:
                op.device_rows(work, out, p.pad_top, p.interior[0] - o0, p.interior[1] - o0, stream, ws)
            if not sync:
                timer.add("compute", _now() - t)   # launch time only: the kernels run on
                t = _now()
            if rounds:
                exchange_packed(be, rounds, edge)
                unpack_halos(rounds, work, p, edge)
            if sync:
                edge.synchronize()
            timer.add("halo", _now() - t)
            t = _now()
            if overlap:
                own_rows_in.wait(edge)             # the boundary reads own rows too
                for j0, j1 in p.boundary:
                    op.device_rows(work, out, p.pad_top, j0 - o0, j1 - o0, edge, edge_ws)
            else:
                halo_in = event("halo in")
                halo_in.record(edge)
                halo_in.wait(stream)
                op.device_rows(work, out, p.pad_top, 0, o1 - o0, stream, ws)
            edge.synchronize()
            stream.synchronize()
            timer.add("compute", _now() - t)
            x, height = out, p.out_height
    return x
