"""Kernels started by hpclab.quick_launch: the same results as Numba's launch, each kind of arguments compiled once,
and the arrays packed word for word as Numba packs them."""
from __future__ import annotations

import numpy as np
import pytest

from hpclab import backend
from hpclab.backend import cuda as _cuda
from hpclab.quick_launch import Launches, array_words

cuda = _cuda()


@cuda.jit
def scaled_sum(x, y, out):
    """out[i, j] = 2 x[i, j] + y[i, j] (a grid of the whole shape)."""
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = 2 * x[i, j] + y[i, j]


def choose(x, y, out, variant=None):
    """(kernel, grid, threads); ``variant``: threads per block along each axis."""
    side = variant or 8
    return scaled_sum, (-(-out.shape[0] // side), -(-out.shape[1] // side)), (side, side)


def test_launches_give_numbas_results_for_every_kind_of_array():
    """Contiguous arrays, a column slice (strides of a wider array, a pointer 8 bytes into a row), a column-major
    array, other block sides, a non-default stream: each the same as NumPy's; one entry per kind of arguments."""
    rng = np.random.default_rng(0)
    launches = Launches(choose)
    x, y = rng.standard_normal((37, 45)), rng.standard_normal((37, 45))
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    out = cuda.device_array((37, 45))
    for _ in range(2):                                    # the same kind twice: one compiled entry
        launches(dx, dy, out)
        np.testing.assert_array_equal(out.copy_to_host(), 2 * x + y)
    wide = cuda.to_device(np.concatenate([x, x], axis=1))
    launches(wide[:, 1:46], dy, out, variant=4)          # strides of a 90-wide array, pointer 8 bytes in
    np.testing.assert_array_equal(out.copy_to_host(), 2 * np.concatenate([x, x], axis=1)[:, 1:46] + y)
    stream = cuda.stream()
    launches(cuda.to_device(np.asfortranarray(x)), dy, out, stream=stream)     # column-major, on a stream
    stream.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), 2 * x + y)
    if backend.name() == "gpu":
        assert len(launches._known) == 3, launches._known.keys()


@cuda.jit
def axpb(x, out, a, b, c, negate):
    """out = a x + b + c (a: float64, b: int64, c: float32), negated where ``negate`` (a bool)."""
    i = cuda.grid(1)
    if i < out.size:
        v = a * x[i] + b + c
        out[i] = -v if negate else v


def test_scalars_are_passed_as_numbas_launch_passes_them():
    """Python floats, ints and bools and NumPy scalars beside arrays: bit for bit what Numba's own launch computes
    (a GPU fuses a * x + b: NumPy's within a rounding), by the packed path on a GPU (one compiled entry)."""
    launches = Launches(lambda x, out, *scalars, variant=None: (axpb, -(-out.size // 64), 64))
    x = np.random.default_rng(1).standard_normal(100)
    dx, out, numbas = cuda.to_device(x), cuda.device_array(100), cuda.device_array(100)
    for a, b, c, negate in [(2.5, 3, np.float32(0.25), False), (-1.5, -7, np.float32(2.0), True)]:
        launches(dx, out, a, b, c, negate)
        axpb[2, 64](dx, numbas, a, b, c, negate)
        np.testing.assert_array_equal(out.copy_to_host(), numbas.copy_to_host())
        want = a * x + b + np.float64(c)
        np.testing.assert_allclose(out.copy_to_host(), -want if negate else want, rtol=1e-14, atol=1e-14)
    if backend.name() == "gpu":
        assert len(launches._known) == 1, launches._known.keys()


@pytest.mark.filterwarnings("ignore:Host array used in CUDA kernel")
def test_arrays_that_are_not_numbas_take_numbas_launch():
    """Host arrays (Numba copies them over and back) never reach the packed path."""
    x, y = np.ones((5, 3)), np.full((5, 3), 2.0)
    out = np.zeros((5, 3))
    launches = Launches(choose)
    launches(x, y, out)
    np.testing.assert_array_equal(out, 4.0)
    assert not launches._known


@pytest.mark.requires_gpu("the words Numba passes for an array argument")
@pytest.mark.parametrize("make", ["matrix", "column slice", "column-major", "batch", "empty"])
def test_array_words_are_numbas_own(make):
    """What Numba's launch passes for each array, compared with ``array_words``: a change in Numba's layout for
    array arguments fails here rather than in a wrong product."""
    base = cuda.to_device(np.arange(6 * 8, dtype=np.float32).reshape(6, 8))
    x = {"matrix": base, "column slice": base[:, 1:],
         "column-major": cuda.to_device(np.zeros((3, 5), np.float32, order="F")),
         "batch": cuda.to_device(np.zeros((2, 3, 4), np.float32)), "empty": cuda.device_array((0, 4), np.float32)}[make]

    @cuda.jit
    def touch(a):
        pass

    compiled = touch.compile((touch.typeof_pyval(x),))
    words, keep = [], []
    compiled._prepare_args(compiled.argument_types[0], x, 0, keep, words)
    assert [int(getattr(w, "value", w) or 0) for w in words] == list(array_words(x))
