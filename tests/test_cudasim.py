"""The simulator's shared arrays (one per block and call site, whatever the thread switches), its device calls,
and its blocks' barrier (threads that leave early, a thread that fails, counting barriers)."""
import threading
import time

import numpy as np
import pytest

from hpclab import backend, cudasim

pytestmark = pytest.mark.skipif(backend.name() != "sim", reason="the CUDA simulator's own threads")
cuda = backend.cuda()       # a module global: the simulator swaps it inside kernels


class _SecondCallerWaits:
    """np.empty whose first caller waits (up to 0.5 s) until a second caller is inside it too:
    the interleaving that a thread switch right after the allocation produces."""

    def __init__(self):
        self.calls, self.lock, self.second = 0, threading.Lock(), threading.Event()

    def empty(self, *args, **kwargs):
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            self.second.wait(0.5)
        else:
            self.second.set()
        return np.empty(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(np, name)


def _allocate_from_two_threads(method):
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    shared = FakeCUDAShared(0)
    got = [None, None]

    def allocate(i):
        got[i] = method(shared, 4, np.float64)          # the same call site in both threads

    threads = [threading.Thread(target=allocate, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_two_threads_of_a_block_get_one_shared_array(monkeypatch):
    backend.cuda()                                      # installs the thread-safe method
    from numba.cuda.simulator import kernelapi

    ours = kernelapi.FakeCUDAShared.array
    assert ours.hpclab_thread_safe
    monkeypatch.setattr(cudasim, "np", _SecondCallerWaits())
    a, b = _allocate_from_two_threads(ours)
    assert a is b

    # Numba's own method under the same interleaving gives each thread its own array.
    monkeypatch.setattr(kernelapi, "np", _SecondCallerWaits())
    a, b = _allocate_from_two_threads(ours.numba_original)
    assert a is not b


class _Sleepy:
    """np.empty that gives the interpreter up for 2 ms: other threads run in the middle."""

    def empty(self, *args, **kwargs):
        time.sleep(0.002)
        return np.empty(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(np, name)


def test_block_reduction_is_exact_when_allocation_switches_threads(monkeypatch):
    from hpclab.pi import fast, mc

    monkeypatch.setattr(cudasim, "np", _Sleepy())
    assert fast.count_hits(0, 1000, 1000) == mc.count_hits_reference(0, 1000, 1000)


def test_device_functions_in_other_modules_see_the_launch_and_are_restored_after_it():
    from numba import cuda

    from hpclab.pi import fast, mc, reduce

    # The kernel lives in fast.py; Philox in mc.py and the block sum (cuda.shared,
    # cuda.syncthreads) in reduce.py: one block of 32 threads calling both per sample.
    assert fast.count_hits(0, 4000, 3, 1, 32) == mc.count_hits_reference(0, 4000, 3)
    assert mc.cuda is cuda and reduce.cuda is cuda and fast.cuda is cuda


def _barrier_kernels():
    import numba

    @cuda.jit
    def leave_early(out):
        s = cuda.shared.array(8, numba.float32)
        i = cuda.threadIdx.x
        s[i] = i + 10 * cuda.blockIdx.x
        cuda.syncthreads()
        if i == 3:
            return                  # the others' next barrier waits only for those still running
        cuda.syncthreads()
        out[cuda.blockIdx.x, i] = s[(i + 1) % 8]

    @cuda.jit
    def fail(out):
        i = cuda.threadIdx.x
        cuda.syncthreads()
        if i == 5:
            raise ValueError("thread five")
        cuda.syncthreads()
        out[i] = 1

    @cuda.jit
    def count(out):
        out[cuda.threadIdx.x] = cuda.syncthreads_count(cuda.threadIdx.x % 3 == 0)

    return leave_early, fail, count


def test_a_block_barrier_waits_for_the_threads_still_running_and_raises_the_first_failure():
    leave_early, fail, count = _barrier_kernels()
    out = np.full((3, 8), -1, np.float32)
    leave_early[3, 8](out)
    want = np.array([[(i + 1) % 8 + 10 * b for i in range(8)] for b in range(3)], np.float32)
    want[:, 3] = -1
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match=r"tid=\[5, 0, 0\].*thread five"):
        fail[1, 8](np.zeros(8))
    counts = np.zeros(9, np.int64)
    count[1, 9](counts)
    assert (counts == 3).all()
    leave_early[3, 8](out)                         # a launch after a failed one runs as before
    np.testing.assert_array_equal(out, want)
