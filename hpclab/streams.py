"""CUDA streams beside the default one, made once per process; each function returns (stream, how),
``how`` saying what was made. On the simulator they are ordinary streams (it runs everything in order).

Numba launches kernels on the legacy default stream, which waits for (and holds up) every ordinary
stream, so work meant to overlap goes on a non-blocking stream. The edge and comm streams also have the
highest priority: the block scheduler hands freed SMs to them first, so a NCCL transfer or a boundary
kernel starts within one block's time instead of after the whole interior.
"""
from __future__ import annotations

from functools import cache

from hpclab import backend


@cache
def _get(name: str, high_priority: bool):
    cu = backend.cuda()
    if backend.is_simulator():
        return cu.stream(), "simulator (streams run synchronously)"
    try:
        from numba.cuda.cudadrv import driver as drv

        ctx = cu.current_context()  # first: it makes the context the driver calls below need
        flags = drv.binding.CUstream_flags.CU_STREAM_NON_BLOCKING.value
        # Lower numbers are higher priorities: (least, greatest) is e.g. (0, -5).
        priority = drv.driver.cuCtxGetStreamPriorityRange()[1] if high_priority else 0
        handle = drv.driver.cuStreamCreateWithPriority(flags, priority)
        return drv.Stream(handle, finalizer=drv._stream_finalizer(ctx.deallocations, handle)), \
            f"non-blocking, priority {priority}"
    except Exception as exc:  # noqa: BLE001 - fall back, and say so
        return cu.stream(), f"ordinary stream (non-blocking stream unavailable: {type(exc).__name__}: {exc})"


def compute_stream():
    """(stream, how) for the interior rows of the halo exchange (notebook 06)."""
    return _get("compute", False)


def edge_stream():
    """(stream, how) for the halo exchange's packing, transfers, unpacking and boundary rows."""
    return _get("edge", True)


def comm_stream():
    """(stream, how) for data-parallel training's gradient all-reduces beside the backward pass (notebook 07)."""
    return _get("comm", True)


@cache
def event(name: str):
    """A CUDA event for ordering one stream after another, made once per name: an event made per call
    would be freed per call, and Numba's batched frees can synchronise the GPU."""
    return backend.cuda().event()
