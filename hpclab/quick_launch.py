"""Start a compiled kernel in a fraction of the host time Numba's launch takes.

numba-cuda turns every array argument of every launch into a memory view and looks up the current context and a
stream object each time, several times the driver's own launch (benchmarks/HISTORY.md, *Starting a kernel*).
:class:`Launches` compiles through Numba once for each kind of arguments (dtype, shape, strides, 16-byte
alignment: all a kernel's choice and its Numba types depend on) and CUDA context, keeps the compiled function
and launch shape, and packs Numba device arrays itself, word for word as Numba does (``array_words``; a GPU test
compares the two), and scalars as the C types Numba gives them (``SCALARS``). Other arguments, and the simulator,
take Numba's own launch.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from hpclab import backend

QUICK = backend.name() == "gpu"      # (decides the backend before anything of Numba loads)
if QUICK:
    from cuda.bindings.driver import cuCtxGetCurrent
    from cuda.core import LaunchConfig, launch as _driver_launch
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import _to_core_stream

_default_streams: dict = {}     # CUDA context -> its default stream as the driver launch takes it
# A scalar argument's type -> what Numba's launch passes (Python float: a C double, int: int64, bool: itself)
SCALARS = {float: np.float64, int: np.int64, bool: bool, np.float64: np.float64, np.float32: np.float32,
           np.int64: np.int64, np.int32: np.int32}


def array_words(x) -> tuple:
    """A device array as a kernel receives it from Numba: meminfo, parent, items, item size, address, shape,
    strides (in bytes), each one machine word."""
    return (0, 0, x.size, x.dtype.itemsize, x.device_ctypes_pointer.value or 0, *x.shape, *x.strides)


class Launches:
    """The launches of one family of kernels. ``choose(*arrays, variant=...)`` returns ``(dispatcher, grid,
    threads)`` for those arrays; it runs once per kind of arguments, and ``launches(*arrays)`` then costs a
    dictionary lookup and the driver's launch."""

    def __init__(self, choose):
        self._choose = choose
        self._known: dict = {}

    def __call__(self, *arrays, variant=None, stream=0) -> None:
        """Launch on ``arrays``: device arrays, and scalars of the types in ``SCALARS``."""
        context = int(cuCtxGetCurrent()[1]) if QUICK and all(
            type(x) is DeviceNDArray or type(x) in SCALARS for x in arrays) else 0
        if not context:     # the simulator, other arguments, or no context yet (Numba's launch makes one)
            kernel, grid, threads = self._choose(*arrays, variant=variant)
            kernel[grid, threads, stream](*arrays)
            return
        words = [array_words(x) if type(x) is DeviceNDArray else (SCALARS[type(x)](x),) for x in arrays]
        key = (variant, context, *((x.dtype, w[5:], w[4] % 16) if type(x) is DeviceNDArray else type(x)
                                   for x, w in zip(arrays, words)))
        known = self._known.get(key)
        if known is None:
            kernel, grid, threads = self._choose(*arrays, variant=variant)
            compiled = kernel.compile(tuple(kernel.typeof_pyval(x) for x in arrays))
            known = self._known[key] = (compiled.library.get_cufunc().kernel,
                                        LaunchConfig(grid=grid, block=threads, shmem_size=0))
        function, config = known
        _driver_launch(_stream(stream, context), config, function, *chain(*words))


def _stream(stream, context):
    """``stream`` (0 or a Numba stream) as the driver launch takes it; Numba's conversion is slow, so the
    default stream's is kept per context."""
    if stream:
        return _to_core_stream(stream)
    known = _default_streams.get(context)
    if known is None:
        known = _default_streams[context] = _to_core_stream(0)
    return known
