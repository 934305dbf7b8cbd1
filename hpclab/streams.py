"""CUDA streams beside the default one, made once per process; each function returns (stream, how),
``how`` saying what was made. On the simulator they are ordinary streams (it runs everything in order).

Numba launches kernels on the legacy default stream, which waits for (and holds up) every ordinary
stream, so work meant to overlap goes on a non-blocking stream. The edge and comm streams also have the
highest priority: the block scheduler hands freed SMs to them first, so a NCCL transfer or a boundary
kernel starts within one block's time instead of after the whole interior.
"""
from __future__ import annotations

from hpclab import backend

_STREAMS: dict[str, tuple] = {}
_EVENTS: dict[str, object] = {}


def _get(name: str, high_priority: bool):
    if name in _STREAMS:
        return _STREAMS[name]
    cu = backend.cuda()
    if backend.is_simulator():
        made = cu.stream(), "simulator (streams run synchronously)"
    else:
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
            made = drv.Stream(handle, finalizer=drv._stream_finalizer(ctx.deallocations, handle)), how
        except Exception as exc:  # noqa: BLE001 - fall back, and say so
            made = cu.stream(), f"ordinary stream (non-blocking stream unavailable: {type(exc).__name__}: {exc})"
    _STREAMS[name] = made
    return made


def compute_stream():
    """(stream, how) for the interior rows of the halo exchange (notebook 06)."""
    return _get("compute", False)


def edge_stream():
    """(stream, how) for the halo exchange's packing, transfers, unpacking and boundary rows."""
    return _get("edge", True)


def comm_stream():
    """(stream, how) for data-parallel training's gradient all-reduces beside the backward pass (notebook 07)."""
    return _get("comm", True)


def event(name: str):
    """A CUDA event for ordering one stream after another, made once per name: an event made per call
    would be freed per call, and Numba's batched frees can synchronise the GPU."""
    if name not in _EVENTS:
        _EVENTS[name] = backend.cuda().event()
    return _EVENTS[name]
