"""The tiled direct convolution of ``python -m benchmarks conv throughput`` (:mod:`benchmarks.conv_direct`):
against SciPy and the NumPy reference, band by band bit for bit, and its place on notebook 06's roofline."""
import numpy as np
import pytest

from hpclab.halo import conv as gpu, reference as ref
from hpclab.halo.geometry import plan_band
from hpclab.halo.measure import conv_traffic

from benchmarks import conv_direct
from tests.test_conv import GEOMETRIES, scipy_conv

RNG = np.random.default_rng(6)


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "N{}C{}H{}W{}K{}R{}S{}s{}p{}".format(*g))
def test_direct_conv2d_matches_scipy(geom):
    n, c, h, w, k, r, s, stride, pad = geom
    x = RNG.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = RNG.uniform(-1, 1, (k, c, r, s)).astype(np.float32)
    want = scipy_conv(x, wt, stride, pad)
    got = conv_direct.conv2d(x, wt, stride, pad)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ref.conv2d(x, wt, stride, pad), want, rtol=1e-4, atol=1e-4)


def test_direct_band_equals_full_kernel_bitwise():
    """A band computed on its own is bit for bit those rows of the whole image, bias and ReLU included."""
    x = RNG.uniform(-1, 1, (1, 2, 9, 5)).astype(np.float32)
    w = RNG.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32)
    b = RNG.uniform(-1, 1, 3).astype(np.float32)
    whole = conv_direct.conv2d(x, w, 2, 1, bias=b, relu=True)
    np.testing.assert_allclose(whole, np.maximum(ref.conv2d(x, w, 2, 1, bias=b), 0), rtol=1e-5, atol=1e-5)
    p = plan_band(9, 3, 2, 1, 2, 1)
    band = gpu.cuda.to_device(np.ascontiguousarray(x[:, :, p.have[0]:p.have[1]]))
    out = gpu.cuda.device_array((1, 3, p.out_rows[1] - p.out_rows[0], whole.shape[3]), np.float32)
    conv_direct.conv_rows_tiled(band, conv_direct.device_weights(w), gpu.cuda.to_device(b), out, 2, p.pad_top, 1,
                                0, out.shape[2], relu=True)
    np.testing.assert_array_equal(out.copy_to_host(), whole[:, :, p.out_rows[0]:p.out_rows[1]])


def test_direct_traffic_lies_between_each_array_once_and_no_reuse():
    flops, nbytes, how = conv_direct.traffic(2, 3, 9, 4, 5, 2)
    assert (flops, "ch tiles") == (conv_traffic("naive", 2, 3, 9, 4, 5, 2)[0], how[-8:])
    assert conv_traffic("cuDNN", 2, 3, 9, 4, 5, 2)[1] < nbytes < conv_traffic("naive", 2, 3, 9, 4, 5, 2)[1]


def test_direct_roofline_point_carries_its_counts_and_time():
    p = conv_direct.roofline_point(repeats=1)
    xh, wt = conv_direct.c2_operands(32)
    flops, nbytes, how = conv_direct.traffic(xh.shape[0], xh.shape[1], xh.shape[2], wt.shape[0], 5, 2)
    assert (p.kernel, p.notebook, p.flops, p.bytes, p.count) == ("direct", "06", flops, nbytes, how)
    assert p.seconds > 0
