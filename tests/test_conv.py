"""Convolution kernels against SciPy/NumPy, halo geometry against brute force,
and the conv-halo program under mpiexec (simulator sizes)."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

try:
    from scipy.signal import correlate2d
except ImportError:  # the GPU machines have no SciPy: the same definition, by shifted slices
    def correlate2d(a, k, mode="valid"):
        r, s = k.shape
        out = np.zeros((a.shape[0] - r + 1, a.shape[1] - s + 1))
        for i, j in itertools.product(range(r), range(s)):
            out += k[i, j] * a[i:i + out.shape[0], j:j + out.shape[1]]
        return out

from hpclab import backend

backend.select()

from hpclab.halo.geometry import brute_force_band, check_ranks, plan_band, plan_bands, schedule, transfers  # noqa: E402
from hpclab.halo.versions import digest, max_rel_error  # noqa: E402
from hpclab.halo import conv as gpu  # noqa: E402
from hpclab.halo import reference as ref  # noqa: E402
from hpclab.halo.bands import hash_values  # noqa: E402

from .helpers import last_json, run_mpi  # noqa: E402

RNG = np.random.default_rng(6)


def scipy_conv(x, w, stride, pad):
    """Independent reference: SciPy's correlate2d per channel pair, summed over channels."""
    n, c, h, wd = x.shape
    k = w.shape[0]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = []
    for b in range(n):
        maps = [sum(correlate2d(xp[b, ci], w[ki, ci].astype(np.float64), mode="valid") for ci in range(c))
                for ki in range(k)]
        out.append(np.stack(maps)[:, ::stride, ::stride])
    return np.stack(out)


GEOMETRIES = [  # N, C, H, W, K, R, S, stride, pad
    (1, 3, 23, 19, 3, 11, 11, 4, 0),     # AlexNet C1's kernel and stride
    (1, 5, 9, 8, 6, 5, 5, 1, 2),         # C2's 5x5 pad 2, channels not a multiple of the chunk
    (2, 3, 7, 6, 3, 3, 3, 2, 1),         # batch of 2, stride 2
    (1, 2, 6, 7, 5, 3, 2, 1, 0),         # rectangular kernel
]


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "N{}C{}H{}W{}K{}R{}S{}s{}p{}".format(*g))
def test_conv2d_matches_scipy(geom):
    """The plain kernel the notebook shows (benchmarks/tests/test_conv_direct.py: the tiled direct kernel)."""
    n, c, h, w, k, r, s, stride, pad = geom
    x = RNG.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = RNG.uniform(-1, 1, (k, c, r, s)).astype(np.float32)
    want = scipy_conv(x, wt, stride, pad)
    got = gpu.conv2d(x, wt, stride, pad, method="naive")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ref.conv2d(x, wt, stride, pad), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("geom", GEOMETRIES[:2], ids=lambda g: "N{}C{}H{}W{}K{}R{}S{}s{}p{}".format(*g))
def test_conv2d_gemm_matches_scipy(geom):
    n, c, h, w, k, r, s, stride, pad = geom
    x = RNG.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = RNG.uniform(-1, 1, (k, c, r, s)).astype(np.float32)
    b = RNG.uniform(-1, 1, k).astype(np.float32)
    want = scipy_conv(x, wt, stride, pad) + b[None, :, None, None]
    got = gpu.conv2d(x, wt, stride, pad, bias=b, relu=True, method="gemm")
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


def test_gemm_chunks_cover_every_output_once():
    from hpclab.halo.conv_gemm import chunks

    for n, rows, wo, limit in ((3, 5, 4, 10 ** 6), (3, 5, 4, 4 * 25), (2, 7, 3, 4 * 6), (1, 9, 5, 1)):
        seen = [(n0 + i, r0 + t) for n0, nb, r0, rr in chunks(n, rows, wo, 4, limit)
                for i in range(nb) for t in range(rr)]
        assert sorted(seen) == [(i, t) for i in range(n) for t in range(rows)]


def test_gemm_in_chunks_equals_one_product_bitwise(monkeypatch):
    """Chunks over images and over rows (forced by a tiny buffer limit) change no bit."""
    from hpclab.halo import conv_gemm

    x = RNG.uniform(-1, 1, (2, 3, 7, 6)).astype(np.float32)
    w = RNG.uniform(-1, 1, (5, 3, 3, 3)).astype(np.float32)
    whole = gpu.conv2d(x, w, 1, 1, method="gemm")
    np.testing.assert_allclose(whole, scipy_conv(x, w, 1, 1), rtol=1e-4, atol=1e-4)
    for limit in (4 * 32 * 7 * 6, 4 * 32 * 12):      # one image per chunk; two rows of one image
        monkeypatch.setattr(conv_gemm, "SIM_MAX_BYTES", limit)
        monkeypatch.setattr(conv_gemm, "DEFAULT_MAX_BYTES", limit)
        np.testing.assert_array_equal(gpu.conv2d(x, w, 1, 1, method="gemm"), whole)


def test_workspace_buffers_start_zeroed(monkeypatch):
    """The products run over columns padded to whole tiles: a new buffer must not hold what the allocator left
    there (NaN stands for it here), also when a buffer grows."""
    from hpclab.halo import conv_gemm

    monkeypatch.setattr(conv_gemm.cuda, "device_array",
                        lambda n, dtype: conv_gemm.cuda.to_device(np.full(n, np.nan, dtype)))
    work = conv_gemm.Workspace()
    small = work.array("cols", (2, 3))
    np.testing.assert_array_equal(small.copy_to_host(), np.zeros((2, 3), np.float32))
    small.copy_to_device(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(work.array("cols", (4, 5)).copy_to_host(), np.zeros((4, 5), np.float32))


WINOGRAD_GEOMETRIES = [  # N, C, H, W, K, R, pad: odd sizes leave partial tiles at both edges
    (1, 5, 9, 8, 6, 5, 2),                # C2's 5x5 pad 2
    (2, 3, 7, 6, 4, 3, 1),                # batch of 2, 3x3 pad 1 (C3-C5)
    (1, 2, 8, 7, 3, 5, 0),                # no padding
]


@pytest.mark.parametrize("geom", WINOGRAD_GEOMETRIES, ids=lambda g: "N{}C{}H{}W{}K{}R{}p{}".format(*g))
def test_conv2d_winograd_matches_scipy(geom):
    n, c, h, w, k, r, pad = geom
    x = RNG.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    wt = RNG.uniform(-1, 1, (k, c, r, r)).astype(np.float32)
    b = RNG.uniform(-1, 1, k).astype(np.float32)
    want = scipy_conv(x, wt, 1, pad) + b[None, :, None, None]
    got = gpu.conv2d(x, wt, 1, pad, bias=b, relu=True, method="winograd")
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_other_tile_sizes_match_scipy(tile):
    """The tile size follows from the transformed filters' shape (what the benchmark's F(2x2), F(4x4) use)."""
    from hpclab.halo import conv_winograd

    x = RNG.uniform(-1, 1, (1, 3, 9, 8)).astype(np.float32)
    wt = RNG.uniform(-1, 1, (4, 3, 5, 5)).astype(np.float32)
    weights = gpu.ConvWeights(wt)
    out = gpu.cuda.device_array((1, 4, 9, 8), np.float32)
    u = gpu.cuda.to_device(conv_winograd.filter_transform(wt, tile))
    conv_winograd.conv_rows_winograd(gpu.cuda.to_device(x), u, weights.bias, out, 5, 2, 2, 0, 9)
    want = scipy_conv(x, wt, 1, 2)
    np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("tile, r, pad, rows", [(4, 5, 2, (3, 13)), (2, 3, 1, (2, 9)), (4, 3, 1, (0, 13))])
def test_winograd_band_of_rows_leaves_the_others(tile, r, pad, rows):
    """Rows [oh_begin, oh_end) of several images, many rows of tiles per block and several blocks: the rows
    asked for equal SciPy's, every other value of ``out`` is untouched."""
    from hpclab.halo import conv_winograd

    x = RNG.uniform(-1, 1, (3, 2, 13, 9)).astype(np.float32)
    wt = RNG.uniform(-1, 1, (3, 2, r, r)).astype(np.float32)
    weights = gpu.ConvWeights(wt)
    want = scipy_conv(x, wt, 1, pad)
    out = gpu.cuda.to_device(np.full(want.shape, np.nan, np.float32))
    u = gpu.cuda.to_device(conv_winograd.filter_transform(wt, tile))
    conv_winograd.conv_rows_winograd(gpu.cuda.to_device(x), u, weights.bias, out, r, pad, pad, *rows)
    got = out.copy_to_host()
    band = slice(*rows)
    np.testing.assert_allclose(got[:, :, band], want[:, :, band], rtol=1e-5, atol=1e-5 * np.abs(want).max())
    outside = np.ones(got.shape, bool)
    outside[:, :, band] = False
    assert np.isnan(got[outside]).all()


def test_winograd_refuses_an_output_that_is_not_contiguous():
    from hpclab.halo import conv_winograd

    wt = RNG.uniform(-1, 1, (2, 1, 3, 3)).astype(np.float32)
    out = gpu.cuda.device_array((1, 2, 6, 12), np.float32)[:, :, :, ::2]
    with pytest.raises(ValueError, match="C-contiguous output array"):
        conv_winograd.conv_rows_winograd(gpu.cuda.to_device(np.zeros((1, 1, 6, 6), np.float32)),
                                         gpu.cuda.to_device(conv_winograd.filter_transform(wt)),
                                         gpu.ConvWeights(wt).bias, out, 3, 1, 1, 0, 6)


@pytest.mark.parametrize("wo", [3100, 5000])
def test_winograd_refuses_rows_too_wide_for_one_block(wo):
    from hpclab.halo import conv_winograd

    with pytest.raises(ValueError, match=f"rows of {wo} values .* use method='gemm'"):
        conv_winograd._output_shape(-(-wo // 4), 4, wo)


def test_winograd_keeps_the_output_vector_only_while_the_array_lives():
    import gc

    from hpclab.halo import conv_winograd

    out = gpu.cuda.device_array((1, 2, 3, 4), np.float32)
    flat = conv_winograd._flat(out)
    assert conv_winograd._flat(out) is flat and flat.shape == (24,)
    key = id(out)
    del out, flat
    gc.collect()
    assert key not in conv_winograd._FLAT


@pytest.mark.parametrize("m, r", [(2, 3), (2, 5), (4, 3), (3, 5), (4, 5)])
def test_winograd_transforms_are_exact_in_one_and_two_dimensions(m, r):
    from hpclab.halo.conv_winograd import transforms

    at, g, bt = transforms(m, r)
    d = RNG.standard_normal((m + r - 1, m + r - 1))
    f = RNG.standard_normal((r, r))
    one_d = at @ ((g @ f[0]) * (bt @ d[0]))
    np.testing.assert_allclose(one_d, [d[0, i:i + r] @ f[0] for i in range(m)], atol=1e-12)
    two_d = at @ ((g @ f @ g.T) * (bt @ d @ bt.T)) @ at.T
    np.testing.assert_allclose(two_d, [[np.sum(d[i:i + r, j:j + r] * f) for j in range(m)] for i in range(m)],
                               atol=1e-12)


def test_winograd_in_chunks_equals_one_pass_bitwise(monkeypatch):
    """Chunks over images and over tile rows change no bit: each tile is computed alone."""
    from hpclab.halo import conv_gemm

    x = RNG.uniform(-1, 1, (2, 3, 9, 6)).astype(np.float32)
    w = RNG.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    whole = gpu.conv2d(x, w, 1, 1, method="winograd")
    per_tile = 4 * 16 * (3 + 4)                       # alpha^2 (C + K) floats per tile
    for limit in (per_tile * 15, per_tile * 6):       # one image per chunk; two tile rows of one image
        monkeypatch.setattr(conv_gemm, "SIM_MAX_BYTES", limit)
        monkeypatch.setattr(conv_gemm, "DEFAULT_MAX_BYTES", limit)
        np.testing.assert_array_equal(gpu.conv2d(x, w, 1, 1, method="winograd"), whole)


@pytest.mark.parametrize("w_shape, stride, words", [
    ((2, 1, 3, 3), 2, "stride 2 (Winograd needs stride 1)"),
    ((2, 1, 11, 11), 1, "a 11x11 kernel"),
    ((2, 1, 3, 2), 1, "a 3x2 kernel"),
])
def test_winograd_refuses_layers_it_cannot_do(w_shape, stride, words):
    with pytest.raises(ValueError, match=re.escape(words) + ".*use method='gemm' or 'naive'"):
        gpu.conv2d(np.zeros((1, 12, 12), np.float32), np.zeros(w_shape, np.float32), stride, method="winograd")


def test_unknown_method_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown convolution method 'fft'; choose one of naive, gemm, winograd"):
        gpu.conv2d(np.zeros((1, 4, 4), np.float32), np.zeros((1, 1, 3, 3), np.float32), method="fft")


def test_conv2d_three_dimensional_input_bias_and_relu():
    x = RNG.uniform(-1, 1, (2, 6, 5)).astype(np.float32)
    w = RNG.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32)
    b = np.array([0.5, -4.0, 0.0], np.float32)
    got = gpu.conv2d(x, w, 1, 1, bias=b, relu=True)
    want = np.maximum(scipy_conv(x[None], w, 1, 1)[0] + b[:, None, None], 0)
    assert got.shape == (3, 6, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (got[1] == 0).sum() > 0 and (got[0] > 0).any()


@pytest.mark.parametrize("bad, words", [
    (dict(x=(3, 5, 5), w=(2, 3, 7, 7), stride=1, pad=0), ["larger than the padded input", "7x7", "5x5"]),
    (dict(x=(3, 5, 5), w=(2, 3, 3, 3), stride=-1, pad=0), ["stride", "-1"]),
    (dict(x=(3, 5, 5), w=(2, 3, 3, 3), stride=1, pad=-2), ["padding", "-2"]),
    (dict(x=(3, 5, 5), w=(2, 4, 3, 3), stride=1, pad=0), ["3 channels", "expect 4"]),
])
def test_conv2d_bad_input(bad, words):
    x = np.zeros(bad["x"], np.float32)
    w = np.zeros(bad["w"], np.float32)
    for fn in (gpu.conv2d, ref.conv2d):
        with pytest.raises(ValueError) as err:
            fn(x, w, bad["stride"], bad["pad"])
        for word in words:
            assert word in str(err.value)


def loops_maxpool(x, size, stride):
    n, c, h, w = x.shape
    ho, wo = (h - size) // stride + 1, (w - size) // stride + 1
    out = np.empty((n, c, ho, wo), np.float32)
    for i, j in itertools.product(range(ho), range(wo)):
        out[:, :, i, j] = x[:, :, i * stride:i * stride + size, j * stride:j * stride + size].max(axis=(2, 3))
    return out


def loops_lrn(x, size=5, alpha=1e-4, beta=0.75, k=2.0):
    c = x.shape[1]
    out = np.empty_like(x, dtype=np.float64)
    for ci in range(c):
        lo, hi = max(0, ci - size // 2), min(c, ci + size // 2 + 1)
        out[:, ci] = x[:, ci] / (k + alpha * (x[:, lo:hi].astype(np.float64) ** 2).sum(axis=1)) ** beta
    return out


def test_maxpool_and_lrn_match_numpy():
    x = RNG.uniform(-3, 3, (2, 7, 9, 8)).astype(np.float32)
    want = loops_maxpool(x, 3, 2)
    np.testing.assert_array_equal(ref.maxpool_rows(x, 3, 2, 0, want.shape[2]), want)
    pooled = gpu.cuda.device_array(want.shape, np.float32)
    gpu.maxpool_rows_device(gpu.cuda.to_device(x), pooled, 3, 2, 0, 0, want.shape[2])
    np.testing.assert_array_equal(pooled.copy_to_host(), want)
    # Large values so that the normalisation actually changes them.
    y = RNG.uniform(-40, 40, (1, 7, 3, 4)).astype(np.float32)
    want = loops_lrn(y)
    assert np.abs(want - y).max() > 1.0
    np.testing.assert_allclose(ref.lrn(y), want, rtol=1e-5)
    np.testing.assert_allclose(gpu.lrn_device(gpu.cuda.to_device(y), 5, 1e-4, 0.75, 2.0).copy_to_host(), want,
                               rtol=1e-5)


def test_linear_layer_matches_numpy():
    """A fully connected layer runs as a 1x1 convolution (im2col + the fast GEMM)."""
    x = RNG.uniform(-1, 1, (3, 21)).astype(np.float32)
    w = RNG.uniform(-1, 1, (10, 21)).astype(np.float32)
    b = RNG.uniform(-1, 1, 10).astype(np.float32)
    got = gpu.linear_device(gpu.cuda.to_device(x), gpu.ConvWeights(w[:, :, None, None], b), relu=True)
    assert got.shape == (3, 10)
    np.testing.assert_allclose(got.copy_to_host(), np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="input has 21 features but the weights expect 20"):
        gpu.linear_device(gpu.cuda.to_device(x), gpu.ConvWeights(w[:, :20, None, None], b))


def test_band_rows_equal_rows_of_the_whole_image():
    """A band computed with its own padding is bit-identical to those rows of the whole."""
    x = RNG.uniform(-1, 1, (1, 3, 12, 6)).astype(np.float32)
    w = RNG.uniform(-1, 1, (4, 3, 5, 5)).astype(np.float32)
    whole = ref.conv2d(x, w, 1, 2)
    for size in (2, 3, 5):
        for p in plan_bands(12, 5, 1, 2, size):
            band = x[:, :, p.have[0]:p.have[1]]
            rows = ref.conv2d_rows(band, w, 1, p.pad_top, 2, p.out_rows[1] - p.out_rows[0])
            np.testing.assert_array_equal(rows, whole[:, :, p.out_rows[0]:p.out_rows[1]])


@pytest.mark.parametrize("r, pad, height, size", [(5, 2, 19, 3), (3, 1, 13, 4), (3, 0, 16, 3)])
def test_winograd_bands_of_whole_tiles_equal_the_whole_image_bitwise(r, pad, height, size):
    """Bands of whole Winograd tiles, each computed as the executor does (interior, then the rows on either side
    of it, from a buffer of the band's input rows alone), are bit for bit those rows of the whole image."""
    x = RNG.uniform(-1, 1, (2, 2, height, 5)).astype(np.float32)
    wts = gpu.ConvWeights(RNG.uniform(-1, 1, (4, 2, r, r)).astype(np.float32), RNG.uniform(-1, 1, 4))
    tile = gpu.tile_rows("winograd", r)
    whole = gpu.conv2d_device(gpu.cuda.to_device(x), wts, 1, pad, method="winograd").copy_to_host()
    plans = plan_bands(height, r, 1, pad, size, tile)
    assert [p.out_rows[0] % tile for p in plans] == [0] * size
    for p in plans:
        (o0, o1), (j0, j1) = p.out_rows, p.interior
        assert j0 == j1 == o1 or (j0 - o0) % tile == 0 and ((j1 - o0) % tile == 0 or j1 == o1)
        band = gpu.cuda.to_device(np.ascontiguousarray(x[:, :, p.have[0]:p.have[1]]))
        out = gpu.cuda.to_device(np.full((2, 4, o1 - o0, whole.shape[3]), np.nan, np.float32))
        for a, b in [p.interior, *p.boundary]:
            gpu.conv_rows_device(band, wts, out, 1, p.pad_top, pad, a - o0, b - o0, method="winograd")
        np.testing.assert_array_equal(out.copy_to_host(), whole[:, :, o0:o1])


@pytest.mark.parametrize("method", ["naive", "gemm"])
def test_device_band_kernel_equals_full_kernel_bitwise(method):
    """A band computed on its own is bit for bit those rows of the whole image, by every exact method."""
    x = RNG.uniform(-1, 1, (1, 2, 9, 5)).astype(np.float32)
    w = RNG.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32)
    wts = gpu.ConvWeights(w)
    whole = gpu.conv2d_device(gpu.cuda.to_device(x), wts, 2, 1, method=method).copy_to_host()
    p = plan_band(9, 3, 2, 1, 2, 1)
    band = gpu.cuda.to_device(np.ascontiguousarray(x[:, :, p.have[0]:p.have[1]]))
    out = gpu.cuda.device_array((1, 3, p.out_rows[1] - p.out_rows[0], whole.shape[3]), np.float32)
    gpu.conv_rows_device(band, wts, out, 2, p.pad_top, 1, 0, out.shape[2], method=method)
    np.testing.assert_array_equal(out.copy_to_host(), whole[:, :, p.out_rows[0]:p.out_rows[1]])


def test_device_chain_split_pass_gives_the_same_output_and_adds_up():
    """Phases(sync=True) (the measured time split) computes the same output as the overlapped run."""
    from mpi4py import MPI

    from hpclab.halo.executors import Buffers, run_device
    from hpclab.halo.layers import Conv, Pool
    from hpclab.timing import Phases

    x = gpu.cuda.to_device(RNG.uniform(-1, 1, (1, 2, 9, 6)).astype(np.float32))
    ops = [Conv("c", RNG.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32), np.zeros(3, np.float32), 1, 1,
                method="gemm"), Pool("p", 3, 2)]
    plain = run_device(ops, x, MPI.COMM_SELF).copy_to_host()
    phases = Phases(sync=True)
    t = MPI.Wtime()
    split = run_device(ops, x, MPI.COMM_SELF, phases=phases, buffers=Buffers()).copy_to_host()
    wall = MPI.Wtime() - t
    np.testing.assert_array_equal(split, plain)
    assert set(phases.seconds) == {"compute", "halo"}
    assert sum(phases.seconds.values()) <= wall


@pytest.mark.parametrize("kernel, stride, pad, tile, in_tile",
                         [(11, 4, 0, 1, 1), (5, 1, 2, 1, 1), (3, 1, 1, 1, 1), (3, 2, 0, 1, 1), (7, 3, 3, 1, 1),
                          (4, 2, 1, 1, 1), (1, 1, 0, 1, 1), (6, 5, 2, 1, 1), (5, 1, 2, 4, 1), (3, 1, 1, 2, 4),
                          (5, 1, 0, 4, 2), (3, 1, 1, 3, 1), (3, 2, 0, 1, 4)])
def test_halo_extents_match_brute_force(kernel, stride, pad, tile, in_tile):
    """Bands (of whole tiles of ``tile`` rows, on input owned in tiles of ``in_tile``: the layer before)."""
    for height in range(max(1, kernel - 2 * pad), 40, 3):
        ho = ref.output_size(height, kernel, stride, pad)
        for size in range(1, min(-(-ho // tile), 7) + 1):
            for p in plan_bands(height, kernel, stride, pad, size, tile, in_tile):
                bf = brute_force_band(height, kernel, stride, pad, size, p.rank, tile, in_tile)
                assert p.out_rows == bf["out_rows"]
                assert set(range(*p.have)) == bf["real"]
                assert p.pad_top + (p.need[1] - p.have[1]) == bf["pad_rows"]
                got = {i: s.src for s in (*p.above, *p.below) for i in range(s.start, s.stop)}
                assert got == bf["owners"]
                assert list(range(*p.interior)) == bf["interior"]
                assert set(range(*p.own)) == bf["own"]


def test_exchange_schedule_delivers_every_halo_row_once():
    for height, kernel, stride, pad, size in [(30, 5, 1, 2, 4), (40, 11, 4, 0, 7), (9, 3, 1, 1, 9),
                                              (23, 11, 4, 0, 4)]:
        plans = plan_bands(height, kernel, stride, pad, size)
        got = {r: [] for r in range(size)}
        for offset, pairs in schedule(transfers(plans), size):
            for r, (send, recv) in pairs.items():
                if send:   # the partner of a send receives it in the same round
                    assert pairs[r + offset][1] == send
                if recv:
                    got[r] += list(range(recv.start, recv.stop))
        for p in plans:
            want = [i for s in (*p.above, *p.below) for i in range(s.start, s.stop)]
            assert sorted(got[p.rank]) == sorted(want) and len(set(want)) == len(want)


def test_more_ranks_than_rows_is_a_clear_error():
    with pytest.raises(ValueError) as err:
        check_ranks(3, 4, "c1")
    assert "3 output rows" in str(err.value) and "4 ranks" in str(err.value)
    assert "mpiexec -n 3" in str(err.value)


def test_too_few_rows_of_winograd_tiles_name_the_tiles_and_the_fixes():
    from hpclab.halo import alexnet
    from hpclab.halo.layers import check_chain

    ops = alexnet.conv_ops("c2", 3, scale=32)             # 5x5 pad 2 (tiles of 4 rows), then max-pool 3x3/2
    ops[0].method = "winograd"
    with pytest.raises(ValueError) as err:
        check_chain(ops, (3, 8, 8), 3)                     # 8 rows: 2 rows of tiles for 3 ranks
    words = str(err.value)
    for part in ("8 output rows in 2 rows of Winograd tiles (4 rows each)", "3 ranks", "mpiexec -n 2",
                 "--method gemm", "an input height of at least 9"):
        assert part in words, words
    check_chain(ops, (3, 9, 9), 3)                         # 9 rows: tiles 4 + 4 + 1
    with pytest.raises(ValueError, match="2 rows of Winograd tiles"):
        plan_bands(8, 5, 1, 2, 3, 4)                       # the executor's own check, on every rank


def test_too_short_a_chain_names_the_least_input_height():
    from hpclab.halo import alexnet
    from hpclab.halo.layers import check_chain, shapes

    ops = alexnet.conv_ops("c1", 3, scale=32)             # 11x11 stride 4, then max-pool 3x3 stride 2
    with pytest.raises(ValueError, match=r"3 output rows but 4 ranks.*or an input height of at least 43\."):
        check_chain(ops, (3, 19, 19), 4)
    rows = lambda h: min(shape[1] for shape in shapes(ops, (3, h, 19)))  # noqa: E731
    assert rows(43) >= 4 > rows(42)


def test_seeded_bands_depend_on_the_global_row_only():
    """(benchmarks/tests/test_conv_scaling.py: the same bits made on the device.)"""
    full = hash_values((2, 3, 10, 4), seed=7)
    assert full.min() >= -1 and full.max() < 1 and abs(float(full.mean())) < 0.2
    np.testing.assert_array_equal(hash_values((2, 3, 4, 4), 7, row0=5, height=10), full[:, :, 5:9])


def test_digest_and_error():
    x = RNG.uniform(-1, 1, (2, 3, 4)).astype(np.float32)
    assert digest(x) == digest(x.copy())
    y = x.copy()
    y[0, 0, 0] += 0.01
    assert digest(y) != digest(x)
    assert digest(x.reshape(3, 2, 4)) != digest(x)
    assert max_rel_error(x, x) == 0.0 and max_rel_error(y, x) > 1e-3


@pytest.mark.parametrize("version", ["v2", "v3"])       # v3 runs on rank 0 alone (and synchronised on a GPU)
def test_time_per_phase_is_the_median_over_passes(monkeypatch, version):
    """One slow pass must not make a phase's bar: each phase takes its median over the passes."""
    from hpclab.halo import versions
    from hpclab.mpi import world

    passes = iter([0.3, 0.1, 0.5, 0.2, 0.6, 0.4])   # timed passes, then (v3 on a GPU) synchronised ones

    def one_pass(version, ops, shape, seed, on, be, overlap, phases, buffers):
        s = next(passes)
        phases.seconds["compute"] += s
        phases.seconds["halo"] += s / 10
        return None, s

    monkeypatch.setattr(versions, "_forward", one_pass)
    o = versions.run_version(version, [], [], (1, 1, 4, 4), 1, world(), repeats=3)
    split = 0.4 if version == "v3" and not backend.is_simulator() else 0.3
    assert o.wall_s == 0.3 and o.phases == pytest.approx({"compute": split, "halo": split / 10})


@pytest.mark.requires_sim("the fallback note is what a machine without a GPU prints")
def test_v5_fallback_note_gives_each_reason_whole():
    """Without NCCL or CUDA-aware MPI, V5 says why in whole sentences, not cut mid-word."""
    from mpi4py import MPI

    from hpclab.halo.versions import gpu_aware_backend

    be, note = gpu_aware_backend(MPI.COMM_SELF)
    assert be.name == "mpi-host"
    reasons = re.search(r"usable here \((.*)\); V5 ran", note).group(1).split("; ")
    assert [r.split(":")[0] for r in reasons] == ["auto", "nccl", "mpi-cuda"]
    assert reasons[1].endswith("simulator (no GPU)"), reasons[1]
    assert note.endswith("so it equals V4")

# -- the program under mpiexec -------------------------------------------------
@pytest.mark.mpi
def test_mpi_two_and_three_ranks_match_serial():
    """The default method is the layer's, whatever the rank count (Winograd on a GPU, in bands of whole tiles:
    12 rows are 3 rows of tiles; naive on the simulator). The band code sums in the serial order, so the digests
    (values to 5 significant digits) are equal whatever the rank count; between methods only a bound holds."""
    runs, methods = {}, {}
    for n, extra in ((2, []), (3, ["--version", "v2,v4"])):
        proc = run_mpi(n, "run", "conv-halo", "--layer", "c2", "--height", "12", "--width", "5", *extra,
                       "--json", timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = last_json(proc)
        assert out["passed"] is True and out["ranks"] == n
        assert out["timings"]["wall_s"] > 0
        runs[n], methods[n] = out["result"]["versions"], out["result"]["methods"]
    assert methods[2] == methods[3] == {"c2": "naive" if backend.is_simulator() else "winograd"}
    assert set(runs[2]) == {"v1", "v2", "v3", "v4", "v5"}
    # The answer does not depend on the number of ranks: same digests with 2 and 3 ranks.
    for v in ("v1", "v2", "v3", "v4"):
        assert runs[2][v]["digest"] == runs[3][v]["digest"]


@pytest.mark.mpi
@pytest.mark.parametrize("method, ranks", [("gemm", 3), ("winograd", 2)])
def test_mpi_each_method_matches_serial(method, ranks):
    """Winograd on 2 ranks: C2's 12 rows in tiles of 4 are bands of 8 and 4 rows, which the pooling after it
    takes as its input's owners (not 6 and 6)."""
    proc = run_mpi(ranks, "run", "conv-halo", "--layer", "c2", "--height", "12", "--width", "5", "--version", "v4",
                   "--method", method, "--json", timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = last_json(proc)
    assert out["passed"] is True and out["result"]["methods"] == {"c2": method}
    assert out["result"]["versions"]["v4"]["digest_matches_twin"] is True


@pytest.mark.mpi
def test_mpi_trunk_with_dense_layers_on_rank_0_finishes():
    """The dense layers run on rank 0 only; the phase times must still be combined without a hang."""
    # --scale 32 (the simulator's default, channels / 32) on every backend: 1000 / 32 -> 31 classes
    proc = run_mpi(2, "run", "conv-halo", "--layer", "trunk", "--height", "99", "--width", "67",
                   "--version", "v2", "--scale", "32", "--json", timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = last_json(proc)
    assert out["passed"] is True and out["result"]["output"] == [1, 31]
    assert "dense_s" in out["timings"]


@pytest.mark.mpi
def test_mpi_more_ranks_than_output_rows_fails_fast():
    proc = run_mpi(4, "run", "conv-halo", "--layer", "c1", "--height", "19", timeout=60)
    assert proc.returncode != 0
    assert "3 output rows" in proc.stderr and "4 ranks" in proc.stderr
    assert "mpiexec -n 3" in proc.stderr


@pytest.mark.mpi
def test_mpi_bad_version_is_reported_on_every_rank():
    proc = run_mpi(2, "run", "conv-halo", "--version", "v7", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("argument --version: unknown version v7") == 1, proc.stderr


def test_the_default_method_on_a_gpu_is_winograd_where_it_applies_else_gemm(monkeypatch):
    monkeypatch.setattr(gpu.backend, "is_simulator", lambda: False)
    assert [gpu.default_method(r, r, s) for r, s in ((3, 1), (5, 1), (11, 4), (3, 2), (7, 1))] == \
        ["winograd", "winograd", "gemm", "gemm", "gemm"]
    monkeypatch.setattr(gpu.backend, "is_simulator", lambda: True)
    assert gpu.default_method(3, 3, 1) == "naive"
