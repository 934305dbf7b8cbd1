"""Data-parallel training: the mechanism PyTorch's DDP hides, in four moves.

1. Rank 0's initial weights are broadcast, so every replica starts the same.
2. Each rank's gradient of its share of the global batch is scaled by 1/global_batch, so the sum over
   ranks is the mean gradient over the global batch: what one GPU would compute.
3. One all-reduce (sum) of the flat gradient bucket per step, the batch's loss in it; with ``overlap``, as
   PyTorch does, buckets of about ``bucket_mb`` (:mod:`hpclab.ddp.buckets`), each all-reduced on a stream
   of its own as soon as the backward pass has written it (every bucket but the last through
   ``hidden_allreduce``, if given).
4. Every rank applies the same update, so the replicas stay identical (:func:`replica_checksums`); with
   ``overlap``, each bucket's part of it as soon as that bucket's all-reduce is done, while the last
   buckets are still being summed.
"""
from __future__ import annotations

import math
import time
import zlib

import numpy as np

from hpclab import backend, comm as hcomm, timeline as T
from hpclab.ddp import buckets as B, mlp as K
from hpclab.ddp.model import EXTRA_SLOTS, MLP, init_parameters
from hpclab.errors import RankError
from hpclab.mpi import MPI
from hpclab.streams import comm_stream
from hpclab.timing import Phases

cuda = K.cuda
OPTIMIZERS = ("sgd", "adam")


def check_same_model(comm, model: MLP) -> None:
    """Compare layer widths and dtypes on all ranks before any collective on them: buffers of different
    lengths in an all-reduce hang or corrupt memory."""
    everyone = comm.allgather((tuple(model.sizes), model.dtype.name, model.compute_dtype.name))
    bad = {r: f"model {list(d[0])} ({d[1]}, compute {d[2]}) but rank 0 has {list(everyone[0][0])} "
              f"({everyone[0][1]}, compute {everyone[0][2]}); every rank must build the same model"
           for r, d in enumerate(everyone) if d != everyone[0]}
    if bad:
        raise RankError("model shape check", bad, comm.size)


def broadcast_parameters(be, model: MLP) -> None:
    """Rank 0's weights to every rank (DDP does this when it wraps the model)."""
    out = be.bcast(model.params, root=0)
    if out is not model.params:
        model.params.copy_to_device(out)
    model.refresh_compute_copy()


def replica_checksums(comm, model: MLP) -> dict:
    """Min and max over ranks of three checksums of the weights, equal iff the replicas agree: a float64
    sum, a position-weighted sum (swapped values) and a CRC32 of the raw bytes (any bit)."""
    p = model.parameters_host()
    p64 = p.astype(np.float64)
    mine = np.array([p64.sum(), (p64 * (1.0 + np.arange(p64.size) % 7)).sum(), float(zlib.crc32(p.tobytes()))])
    lo, hi = np.empty_like(mine), np.empty_like(mine)
    comm.Allreduce(mine, lo, op=MPI().MIN)
    comm.Allreduce(mine, hi, op=MPI().MAX)
    return {"identical": bool(np.array_equal(lo, hi)), "sum": float(mine[0]), "min": lo.tolist(), "max": hi.tolist()}


class LossScaler:
    """Dynamic loss scaling for float16 gradients (PyTorch's GradScaler's): the loss times ``scale``, so that
    small gradients survive float16, the gradients divided by it before the update. A step whose gradients
    overflow is skipped and the scale halved; ``growth_interval`` good steps in a row double it."""

    def __init__(self, scale: float = 2.0 ** 16, growth_interval: int = 200):
        self.scale, self.growth_interval = scale, growth_interval
        self.good_steps, self.skipped = 0, 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale, self.good_steps, self.skipped = self.scale / 2, 0, self.skipped + 1
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale, self.good_steps = self.scale * 2, 0


class DDPTrainer:
    """Trains one replica of ``model``; call the same methods on every rank. ``hidden_allreduce(backend)``, if
    given, is called once (collectively) with overlapped buckets: it returns how the buckets the backward pass
    hides are summed, a function (buf, out, stream) -> bool like ``allreduce_enqueue``, or None."""

    def __init__(self, model: MLP, comm, comm_backend="auto", optimizer: str = "sgd",
                 lr: float = 0.01, momentum: float = 0.0, scale_lr: bool = False,
                 loss: str = "xent", loss_scaling: bool = False, overlap: bool = False,
                 bucket_mb: float = 25.0, first_layer_slices: int = 1, hidden_allreduce=None):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if not lr > 0:
            raise ValueError(f"the learning rate must be positive (got {lr})")
        self.model, self.comm, self.loss = model, comm, loss
        self.be = hcomm.get(comm_backend, comm) if isinstance(comm_backend, str) else comm_backend
        self.optimizer, self.momentum = optimizer, momentum
        # Linear scaling rule: n ranks at a fixed per-rank batch see an n times larger global batch: larger steps.
        self.lr = lr * comm.size if scale_lr else lr
        self.scaler = LossScaler() if loss_scaling else None
        self.phases = Phases(sync=True)
        self.steps = 0
        self.timeline = None       # a hpclab.timeline.Timeline: each step's spans recorded in it
        check_same_model(comm, model)
        broadcast_parameters(self.be, model)
        zeros = np.zeros(model.n_params, model.dtype)
        self.state = [cuda.to_device(zeros) for _ in range(1 if optimizer == "sgd" else 2)]   # velocity, or 2 moments
        self.overlap, self.first_layer_slices = overlap, first_layer_slices if overlap else 1
        self.hidden_allreduce = None
        # The all-reduced gradients land here, one buffer for the whole training (not 200 MB allocated and
        # freed per step); the models were checked to agree above, so the all-reduce skips its shape check.
        self.summed = cuda.device_array_like(model.bucket)
        if overlap:
            self.buckets = B.plan(model.sizes, bucket_mb * 2 ** 20, model.dtype.itemsize, first_layer_slices)
            self.comm_stream = comm_stream()[0]
            # Per bucket: "gradients written" on the default stream, the all-reduce's start and end on the comm
            # stream (made once: events made per step are freed per step).
            self._events = [[cuda.event() for _ in range(3)] for _ in self.buckets]
            self._backward_done, self._stats_copied = cuda.event(), cuda.event()
            self._stats_host = cuda.pinned_array(EXTRA_SLOTS, model.dtype)   # the summed loss, copied early
            self.allreduce_busy_s = 0.0     # GPU time of the bucket all-reduces, summed over steps
            self.host_queue_s = 0.0         # the host's time queueing the steps' work, waits left out, summed
            # Each bucket's views (its gradients, their sums, and what its update reads and writes), made once: a
            # view of a device array costs the host tens of microseconds, and a step would make thirty
            n = model.n_params
            self._views = [(model.bucket[b.start:b.stop], self.summed[b.start:b.stop],
                            self._update_views(self.summed, b.start, min(b.stop, n))) for b in self.buckets]
            self._stats_sums = self.summed[n:]
            # The last bucket's all-reduce runs after the backward pass, beside nothing: the backend's own.
            if hidden_allreduce and len(self.buckets) > 1:
                self.hidden_allreduce = hidden_allreduce(self.be)   # collective: here, not in a step

    def step(self, x_dev, y_dev, idx_dev, global_batch: int) -> tuple[float, float]:
        """One training step on this rank's rows ``idx_dev`` of the data set; returns the global batch's
        mean loss and number of correct predictions (identical on every rank)."""
        if self.overlap:
            return self._step_overlapped(x_dev, y_dev, idx_dev, global_batch)
        with self.phases("compute"):
            loss_scale = self._forward_backward(x_dev, y_dev, idx_dev, global_batch)
        with self.phases("comm"), (self.timeline or T.OFF).span("all-reduce, whole model", "comm"):
            summed = self.be.allreduce(self.model.bucket, op="sum", out=self.summed, check=False)
        return self._update(summed, loss_scale)

    def _forward_backward(self, x_dev, y_dev, idx_dev, global_batch: int, on_ready=None) -> float:
        """This rank's rows through the model and back: gradients (and loss slots) in the
        bucket. Returns the loss scale used (1 without loss scaling)."""
        model = self.model
        loss_scale = self.scaler.scale if self.scaler else 1.0
        tl = self.timeline
        if tl:              # a span per layer's gradients, cut where the backward pass reports a layer written
            tl.cut(f"forward, layer {len(model.sizes) - 2} gradients")
            then = on_ready

            def on_ready(i, start):
                if start == model.offsets[i]:
                    tl.cut(f"layer {i - 1} gradients" if i else None)
                if then:
                    then(i, start)
        model.batch_gradients(x_dev, y_dev, idx_dev, global_batch, self.loss, loss_scale, on_ready=on_ready,
                              first_layer_slices=self.first_layer_slices)
        return loss_scale

    def _step_overlapped(self, x_dev, y_dev, idx_dev, global_batch: int) -> tuple[float, float]:
        """:meth:`step` with each gradient bucket all-reduced as soon as it is written, and (without loss
        scaling, whose overflow test needs every gradient first) its part of the update queued behind that
        all-reduce. Phases: ``compute`` until the backward pass is done, ``comm`` the all-reduce time left
        after it (not hidden), ``update`` the rest of the step; ``allreduce_busy_s`` adds up how long the
        all-reduces took."""
        model = self.model
        queue = list(zip(self.buckets, self._events, self._views))
        blocking = 0.0             # seconds in all-reduces that ran to completion (MPI backends)
        tl = self.timeline or T.OFF

        def start_ready(layer: int, start: int) -> None:
            nonlocal blocking
            while queue and queue[0][0].start >= start:
                b, (written, begun, done), (grads, sums, _) = queue.pop(0)
                written.record(0)                   # after the kernels that wrote this bucket...
                written.wait(self.comm_stream)      # ...which the comm stream now waits for
                begun.record(self.comm_stream)
                t0 = time.perf_counter()
                with tl.span(f"all-reduce {b.name}", "comm", self.comm_stream, "comm stream"):
                    # b.start 0: the last bucket, which nothing hides
                    enqueue = self.hidden_allreduce if b.start and self.hidden_allreduce else self.be.allreduce_enqueue
                    if not enqueue(grads, sums, self.comm_stream):
                        blocking += time.perf_counter() - t0
                done.record(self.comm_stream)
                if b.stop > model.n_params:         # the loss slots: to the host while the backward goes on
                    self._stats_sums.copy_to_host(self._stats_host, stream=self.comm_stream)
                    self._stats_copied.record(self.comm_stream)

        # Timed by hand: a Phases block synchronises the whole device, the comm stream too.
        cuda.synchronize()
        t0 = time.perf_counter()
        loss_scale = self._forward_backward(x_dev, y_dev, idx_dev, global_batch, on_ready=start_ready)
        self._backward_done.record(0)
        queued = time.perf_counter() - t0 - blocking
        if self.scaler is None:
            self._stats_copied.synchronize()
            loss, correct = self._checked_loss(self._stats_host)
            tu = time.perf_counter()
            with tl.span("update", "compute"):
                for (_, _, done), (_, _, views) in zip(self._events, self._views):
                    done.wait(0)                    # the default stream waits for this bucket's sums
                    self._optimizer_step(views, 1.0)
                model.refresh_compute_copy()
            queued += time.perf_counter() - tu
        self.host_queue_s += queued
        self._backward_done.synchronize()           # the backward pass, not the all-reduces
        t1 = time.perf_counter()
        cuda.synchronize()
        t2 = time.perf_counter()
        # What ran after the backward pass: the all-reduces still going (exposed), then any update left.
        exposed = t2 - t1 if self.scaler else \
            min(t2 - t1, max(0.0, self._backward_done.elapsed_time(self._events[-1][2]) / 1e3))
        self.phases.seconds["compute"] += t1 - t0 - blocking
        self.phases.seconds["comm"] += exposed + blocking
        self.allreduce_busy_s += blocking or sum(begun.elapsed_time(done) for _, begun, done in self._events) / 1e3
        if self.scaler:
            return self._update(self.summed, loss_scale)
        self.phases.seconds["update"] += t2 - t1 - exposed
        self.steps += 1
        return loss, correct

    def _checked_loss(self, stats) -> tuple[float, float]:
        """(loss, correct predictions) from the summed slots; a diverged loss is an error on every rank."""
        loss, correct = (float(v) for v in stats)
        if not math.isfinite(loss):
            why = (f"the loss became {loss} at step {self.steps + 1} (learning rate {self.lr:g}); "
                   "training diverged: lower --lr (or use --optimizer adam)")
            # Every rank saw the same summed loss: all raise the same error.
            raise RankError("training", dict.fromkeys(range(self.comm.size), why), self.comm.size)
        return loss, correct

    def _update_views(self, grads, lo: int, hi: int) -> tuple:
        """(parameters, summed gradients, optimiser state...) [lo, hi): what an update of that range reads and
        writes (elementwise: any range)."""
        return (self.model.params[lo:hi], grads[lo:hi], *(s[lo:hi] for s in self.state))

    def _optimizer_step(self, views: tuple, grad_scale: float) -> None:
        """The update of the parameters in ``views`` (:meth:`_update_views`) from their summed gradients."""
        if self.optimizer == "sgd":
            K.sgd_update(*views, self.lr, self.momentum, grad_scale)
        else:
            K.adam_update(*views, self.steps + 1, self.lr, grad_scale=grad_scale)

    def _update(self, summed, loss_scale: float) -> tuple[float, float]:
        """Loss, correct predictions and the optimiser step from the summed bucket."""
        model = self.model
        with self.phases("update"), (self.timeline or T.OFF).span("update", "compute"):
            loss, correct = self._checked_loss(summed[model.n_params:].copy_to_host())
            grads = summed[:model.n_params]
            overflow = self.scaler is not None and K.any_nonfinite(grads)   # the same on every rank: same sums
            if self.scaler:
                self.scaler.update(overflow)
            if not overflow:                # an overflowing step is skipped
                self._optimizer_step(self._update_views(grads, 0, model.n_params), 1.0 / loss_scale)
                model.refresh_compute_copy()
        self.steps += 1
        return loss, correct

    def train_epoch(self, x_dev, y_dev, sampler, epoch: int) -> tuple[list[float], float]:
        """All steps of one epoch; returns (per-step losses, accuracy over the epoch)."""
        idx_dev = cuda.to_device(sampler.indices(epoch))
        steps = [self.step(x_dev, y_dev, idx_dev[s], sampler.global_batch) for s in range(sampler.steps_per_epoch)]
        return [loss for loss, _ in steps], sum(c for _, c in steps) / (sampler.steps_per_epoch * sampler.global_batch)

    def evaluate(self, x_dev, y_dev, batch: int = 512) -> tuple[float, float]:
        """(mean loss, accuracy) over a whole data set, shared among the ranks."""
        n = x_dev.shape[0]
        start, stop = hcomm.block_range(n, self.comm.size, self.comm.rank)
        totals = np.zeros(2)
        for lo in range(start, stop, batch):
            rows = min(batch, stop - lo)
            totals += self.model.evaluate_rows(x_dev[lo:lo + rows], y_dev[lo:lo + rows], self.loss)
        self.comm.Allreduce(MPI().IN_PLACE, totals, op=MPI().SUM)
        per = n if self.loss == "xent" else n * self.model.sizes[-1]
        return float(totals[0] / per), float(totals[1] / n)


def random_batch(comm, sizes, rows: int) -> list:
    """(inputs, class labels, row indices 0..rows-1) on the device, random per rank: for timing steps,
    whose speed does not depend on the values."""
    rng = np.random.default_rng(comm.rank)
    return [cuda.to_device(v) for v in (rng.standard_normal((rows, sizes[0])).astype(np.float32),
                                        rng.integers(0, sizes[-1], (rows, 1)).astype(np.int32),
                                        np.arange(rows, dtype=np.int32))]


def timeline_step(comm, overlap: bool, sizes=None, per_rank: int | None = None) -> list[dict] | None:
    """A step of an MLP (3 x 4096, 1024 samples a rank on a GPU) after two untimed ones, a bucket a
    layer: every rank's spans (:mod:`hpclab.timeline`) on rank 0."""
    sizes = sizes or backend.auto_size(gpu=[4096] * 4, sim=[6, 4, 4, 2])
    per_rank = per_rank or backend.auto_size(gpu=1024, sim=8)
    model = MLP(sizes)
    model.load(init_parameters(sizes, seed=0))
    trainer = DDPTrainer(model, comm, lr=1e-3, overlap=overlap, bucket_mb=1e-6)   # below any layer's size
    batch = random_batch(comm, sizes, per_rank)
    for timed in (False, False, True):
        if timed:
            trainer.timeline = T.Timeline()
            trainer.timeline.start(comm)
        trainer.step(*batch, per_rank * comm.size)
    return trainer.timeline.spans()
