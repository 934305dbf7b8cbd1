"""Pipeline parallelism: the MLP's layers as stages, layer s on rank s, and GPipe's bubble.

A batch is cut into m micro-batches; stage s works on micro-batch j at clock tick s + j and hands its output
to stage s + 1, so the first stages idle at the end and the last ones at the start. With p stages of equal
time the idle share of the schedule, the bubble, is (p - 1) / (m + p - 1) (GPipe): more micro-batches, less.
"""
from __future__ import annotations

import numpy as np

from hpclab.ddp import mlp as K
from hpclab.ddp.model import init_parameters, unflatten
from hpclab.mpi import MPI
from hpclab.timing import median_times

cuda = K.cuda


def bubble(stages: int, micro: int) -> float:
    return (stages - 1) / (micro + stages - 1)


def stage_layer(sizes, stage: int, dtype=np.float32):
    """(W, b) of layer ``stage`` of the MLP ``sizes`` on this rank's GPU (every stage draws the same MLP, seed 0)."""
    w, b = unflatten(init_parameters(sizes, 0, dtype), sizes)[stage]
    return cuda.to_device(np.ascontiguousarray(w)), cuda.to_device(b)


def stage_times(sizes, stage: int, rows: int, repeats: int = 5) -> list[float]:
    """Median seconds of the stage's forward and backward pass on a micro-batch of ``rows`` rows, in float32 (the
    first stage computes no gradient for its input: no stage before it needs one)."""
    w, b = stage_layer(sizes, stage)
    rng, (n_in, n_out) = np.random.default_rng(stage), w.shape
    x, dz = (cuda.to_device(rng.standard_normal((rows, n)).astype(np.float32)) for n in (n_in, n_out))
    y, dw, db = cuda.device_array((rows, n_out), np.float32), cuda.device_array_like(w), cuda.device_array_like(b)
    dx = cuda.device_array((rows, n_in), np.float32) if stage else None
    return median_times(lambda: K.dense_forward(x, w, b, y, relu=stage < len(sizes) - 2),
                        lambda: K.dense_backward(x, w, dz, dw, db, dx), repeats=repeats)


def forward(be, sizes, x, micro: int):
    """The MLP's forward pass on ``x`` (float64, every rank) pipelined: rank s applies layer s to each micro-batch
    and sends it on to rank s + 1 as it receives the next one. The outputs on the last stage, None elsewhere."""
    s, p, none = be.rank, be.size, MPI().PROC_NULL
    if len(sizes) != p + 1 or x.shape[1] != sizes[0] or not 1 <= micro <= len(x):   # checked alike on every rank
        raise ValueError(f"{p} stages take an MLP of {p} layers, inputs of {sizes[0]} features and 1 to {len(x)} "
                         f"micro-batches, not {len(sizes) - 1} layers, {x.shape[1]} features, {micro} micro-batches")
    w, b = stage_layer(sizes, s, np.float64)
    chunks = np.array_split(x, micro)
    inbox = [cuda.to_device(c) if s == 0 else cuda.device_array((len(c), sizes[s])) for c in chunks]
    outs = [cuda.device_array((len(c), sizes[s + 1])) for c in chunks]
    for tick in range(micro + p - 1):
        j = tick - s                                      # the micro-batch this stage works on now
        if 0 <= j < micro:
            K.dense_forward(inbox[j], w, b, outs[j], relu=s < p - 1)
        send = 0 <= j < micro and s < p - 1               # this output to the next stage, while ...
        recv = 0 <= j + 1 < micro and s > 0               # ... the previous one's next output arrives
        if send or recv:
            be.sendrecv(outs[j if send else 0], s + 1 if send else none, s - 1 if recv else none,
                        inbox[j + 1] if recv else None)
    return np.concatenate([o.copy_to_host() for o in outs]) if s == p - 1 else None


def schedule(fwd, bwd, micro: int) -> list[tuple]:
    """GPipe's spans (stage, micro-batch, "F" or "B", start, end) from each stage's forward and backward seconds:
    all forwards, then the backwards from the last stage back, each as soon as its input and its stage are free."""
    p, free, done, spans = len(fwd), [0.0] * len(fwd), {}, []
    for kind, times, stages, before in (("F", fwd, range(p), -1), ("B", bwd, range(p - 1, -1, -1), 1)):
        for j in range(micro):
            for s in stages:
                start = max(free[s], done.get((kind, s + before, j), 0.0))
                done[kind, s, j] = free[s] = start + times[s]
                spans.append((s, j, kind, start, free[s]))
    return spans


def idle_fraction(spans) -> float:
    """The share of the stages' time that the schedule leaves idle: 1 - busy / (stages x makespan)."""
    stages = 1 + max(s for s, *_ in spans)
    return 1 - sum(end - start for *_, start, end in spans) / (stages * max(end for *_, end in spans))
