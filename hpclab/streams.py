"""CUDA streams beside the default one, created once per process.

Numba launches kernels on the legacy default stream, which waits for (and
holds up) every ordinary stream: work meant to overlap with kernels must go
on a non-blocking stream. Three are made here:

- ``compute_stream()``: the interior rows. A non-blocking stream, so it
  does not wait for (or hold up) work on the legacy default stream.
- ``edge_stream()``: packing, the halo exchange, unpacking and the boundary
  rows. Non-blocking and of the highest priority the GPU offers: while the
  interior's kernels fill every SM, the GPU's block scheduler hands freed
  SMs to this stream's kernels first, so a NCCL transfer or a boundary
  kernel starts within one block's time instead of after the whole interior.
  Both serve the halo exchange's device executor (notebook 06).
- ``comm_stream()``: data-parallel training's gradient all-reduces, overlapped
  with the backward pass on the default stream (notebook 07); non-blocking
  and of the highest priority, for the edge stream's reason.

Each returns (stream, how): ``how`` says what was made, for reports. On the
simulator they are ordinary streams (everything runs synchronously there).
``event(name)`` gives a CUDA event kept for reuse: an event made per call
would be freed per call, and Numba's batched frees can synchronise the GPU.
"""
from __future__ import annotations

from hpclab import backend

_STREAMS: dict[str, tuple] = {}
_EVENTS: dict[str, object] = {}


def _create(high_priority: bool):
    from hpclab.backend import cuda

    cu = cuda()
    if backend.is_simulator():
        return cu.stream(), "simulator (streams run synchronously)"
    try:
        from numba.cuda.cudadrv import driver as drv

        ctx = cu.current_context()
        flags = drv.binding.CUstream_flags.CU_STREAM_NON_BLOCKING.value
        how = "non-blocking"
        if high_priority:
            # Lower numbers are higher priorities: (least, greatest) is e.g. (0, -5).
            _, greatest = drv.driver.cuCtxGetStreamPriorityRange()
            handle = drv.driver.cuStreamCreateWithPriority(flags, greatest)
            how = f"non-blocking, priority {greatest}"
        else:
            handle = drv.driver.cuStreamCreate(flags)
        return drv.Stream(handle, finalizer=drv._stream_finalizer(ctx.deallocations, handle)), how
    except Exception as exc:  # noqa: BLE001 - fall back, and say so
        return cu.stream(), f"ordinary stream (non-blocking stream unavailable: {type(exc).__name__}: {exc})"


def _get(name: str, high_priority: bool):
    if name not in _STREAMS:
        _STREAMS[name] = _create(high_priority)
    return _STREAMS[name]


def compute_stream():
    """(stream, how) for the interior rows."""
    return _get("compute", False)


def edge_stream():
    """(stream, how) for the halo exchange and the boundary rows."""
    return _get("edge", True)


def comm_stream():
    """(stream, how) for gradient all-reduces beside the backward pass."""
    return _get("comm", True)


def event(name: str):
    """A CUDA event for ordering one stream after another, made once per name."""
    if name not in _EVENTS:
        from hpclab.backend import cuda

        _EVENTS[name] = cuda().event()
    return _EVENTS[name]
