"""Two fixes to Numba's CUDA simulator (numba-cuda 0.30), installed by ``hpclab.backend.cuda()``.

Shared arrays: each CUDA thread is a Python thread; the first to reach ``cuda.shared.array(...)``
allocates the block's array under the caller's file and line, the others look it up, not atomically
(``FakeCUDAShared.array``): under load a thread got an array of its own, and a block reduction returned
``np.empty``'s garbage. Here lookup and store happen under a lock, the caller is found from its frame
(the original walks the whole stack per call), and a GPU kernel's ``alignment`` is accepted. Dynamic
shared memory (size 0) is the launch's buffer, as in the original.

Device calls: Numba swaps a module's ``cuda`` global for the fake module on every device function call,
under one lock per module (numba-cuda PR #690): with 32 threads calling per sample, one block counting
20,000 Monte Carlo samples took 90 s instead of 0.5 s, at random. Here a module is swapped once per
launch, at its first device call, and back when the launch ends: no lock, and no thread sees the real
module mid-launch.
"""
from __future__ import annotations

import contextlib
import sys
import threading

import numpy as np

_lock = threading.Lock()


def install() -> None:
    """Thread-safe shared arrays and lock-free device calls in the simulator (idempotent)."""
    _install_shared_array()
    _install_launch_scoped_swap()


def forbid_launches(error: Exception) -> None:
    """Make every kernel launch from the host raise ``error`` (device functions and threads still run)."""
    from numba.cuda.simulator import kernel

    fake = kernel.FakeCUDAKernel
    if getattr(fake.__call__, "hpclab_forbidden", False):
        return
    call = fake.__call__

    def forbidden(self, *args):
        if not self._device and kernel._get_kernel_context() is None:
            raise error
        return call(self, *args)

    forbidden.hpclab_forbidden = True
    fake.__call__ = forbidden


def _install_shared_array() -> None:
    """Make ``cuda.shared.array`` allocate once per block and call site, atomically."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "hpclab_thread_safe", False):
        return

    def array(self, shape, dtype, alignment=None):
        # alignment is a hint for the compiler's wide loads; NumPy's arrays are aligned anyway,
        # and accepting it keeps kernels free of simulator branches.
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        if shape == 0:          # dynamic shared memory: the launch's one buffer, as in the original
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=self._dynshared_size // dtype.itemsize)
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


def _install_launch_scoped_swap() -> None:
    """Swap a module's ``cuda`` globals for the fake module once per launch, without a lock."""
    from numba import cuda as real_cuda
    from numba.cuda.simulator import kernel, kernelapi

    if not hasattr(kernel, "_push_kernel_context") or getattr(
            kernel.swapped_cuda_module, "hpclab_launch_scoped", False):
        return                            # another simulator layout, or installed already
    per_call = kernel.swapped_cuda_module
    push_context = kernel._push_kernel_context
    names_of = {}         # id(module globals) -> the names that hold the cuda module
    swapped = {}          # (id(globals), name) -> globals, swapped during the running launch

    def cuda_names(globs) -> list:
        key = id(globs)
        if key not in names_of:
            # A name may already hold another thread's fake module: it counts too.
            found = [k for k, v in list(globs.items())
                     if v is real_cuda or isinstance(v, kernelapi.FakeCUDAModule)]
            names_of.setdefault(key, found)
        return names_of[key]

    @contextlib.contextmanager
    def swapped_cuda_module(fn, fake):
        if kernel._get_kernel_context() is None:      # a device function called on the host
            with per_call(fn, fake):
                yield
            return
        globs = fn.__globals__
        for name in cuda_names(globs):
            if globs[name] is not fake:                # same value from any thread: no race
                globs[name] = fake
                swapped[(id(globs), name)] = globs
        yield

    @contextlib.contextmanager
    def push_kernel_context(mod):
        with push_context(mod):
            try:
                yield
            finally:
                for (_, name), globs in list(swapped.items()):
                    globs[name] = real_cuda
                swapped.clear()

    swapped_cuda_module.hpclab_launch_scoped = True
    kernel.swapped_cuda_module = swapped_cuda_module
    kernel._push_kernel_context = push_kernel_context
