"""Three fixes to Numba's CUDA simulator (numba-cuda 0.30), installed by ``hpclab.backend.cuda()``.

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

Blocks: the simulator's ``BlockManager.run`` polls its threads in a loop (every thread's ``is_alive`` and
``syncthreads`` flag, over and over) for as long as the block runs, so the polling thread holds the GIL
about as often as the simulated CUDA threads do; in a profile of a Winograd test, 14 s of 30 went to that
loop. Here a barrier counts the threads that wait at ``syncthreads()`` and the threads still running: the
last to arrive, or the last to finish while the others wait, releases them, and the launching thread
sleeps until every thread has finished or one has raised (which, as in the original, aborts the others).
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
    _install_sleeping_block_manager()


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


def _install_sleeping_block_manager() -> None:
    """Run a block's threads with a counting barrier: no thread polls another."""
    from numba.cuda.simulator import kernel

    manager, thread = kernel.BlockManager, kernel.BlockThread
    if getattr(manager.run, "hpclab_sleeping", False):
        return

    def release(m) -> None:                 # under m.hpclab_cond: every running thread waits, or one failed
        m.hpclab_waiting = 0
        m.hpclab_generation += 1
        m.hpclab_cond.notify_all()

    def syncthreads(self):
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        m = self._manager
        with m.hpclab_cond:
            generation = m.hpclab_generation
            m.hpclab_waiting += 1
            if m.hpclab_waiting == m.hpclab_running:
                release(m)
            while m.hpclab_generation == generation:
                m.hpclab_cond.wait()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    original_thread_run = thread.run

    def thread_run(self):
        try:
            original_thread_run(self)       # stores an exception on the thread, as before
        finally:
            m = self._manager
            with m.hpclab_cond:
                m.hpclab_running -= 1
                if self.exception is not None and m.hpclab_failed is None:
                    m.hpclab_failed = self          # the first failure, not the aborts it causes
                if m.hpclab_failed or (m.hpclab_running and m.hpclab_waiting == m.hpclab_running):
                    release(m)
                m.hpclab_cond.notify_all()

    def run(self, grid_point, *args):
        self.hpclab_cond = threading.Condition()
        self.hpclab_running = int(np.prod(self._block_dim))   # all counted before any starts
        self.hpclab_waiting = self.hpclab_generation = 0
        self.hpclab_failed = None
        threads = [thread(lambda: self._f(*args), self, grid_point, point, self._debug)
                   for point in np.ndindex(*self._block_dim)]
        for t in threads:
            t.start()
        with self.hpclab_cond:
            while self.hpclab_running and not self.hpclab_failed:
                self.hpclab_cond.wait()
            failed = self.hpclab_failed
            if failed:                      # abort the others (they raise at their barrier), do not join
                for t in threads:
                    t.abort = True
                release(self)
        if failed:
            raise failed.exception[0].with_traceback(failed.exception[1])

    run.hpclab_sleeping = True
    thread.syncthreads, thread.run, manager.run = syncthreads, thread_run, run
