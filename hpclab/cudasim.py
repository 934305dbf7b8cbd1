"""Numba's CUDA simulator with thread-safe shared arrays.

The simulator runs each CUDA thread of a block as a Python thread. The first
thread to reach ``cuda.shared.array(...)`` allocates the block's array and
stores it under the caller's file and line; the others find it there. That
lookup and the store are not atomic (numba-cuda 0.30, ``FakeCUDAShared.array``):
when the interpreter switches threads between them -- it may, after the
``np.empty`` call returns, and under load it does -- a second thread allocates
an array of its own. The threads of one block then write to different arrays,
and a block reduction returns garbage (``np.empty``'s contents). That is how a
Monte Carlo count with a fixed seed came out different, once in a while, in a
full test run and never in a notebook run alone.

:func:`install` replaces the method by one that does the lookup and the store
under a lock, finding the caller from its frame (the original walks the whole
stack with ``traceback.extract_stack`` for every call, which is also slow).
``hpclab.backend.cuda()`` installs it whenever the simulator is in use.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

_lock = threading.Lock()


def install() -> None:
    """Make ``cuda.shared.array`` allocate once per block and call site, atomically (idempotent)."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "hpclab_thread_safe", False):
        return

    def array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        if shape == 0:                   # dynamic shared memory: one buffer for every call
            return np.frombuffer(self._dynshared.data, dtype=dtype,
                                 count=self._dynshared_size // dtype.itemsize)
        frame = sys._getframe(1)
        key = (frame.f_code.co_filename, frame.f_lineno)     # as the original: one array per line
        with _lock:
            found = self._allocations.get(key)
            if found is None:
                found = self._allocations[key] = np.empty(shape, dtype)
        return found

    array.hpclab_thread_safe = True
    array.numba_original = shared.array        # kept for the test that shows the race
    shared.array = array
