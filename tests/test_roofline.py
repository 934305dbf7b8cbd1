"""The roofline: the roof kernels against NumPy, the counts, the recorded points and the figure."""
from __future__ import annotations

import numpy as np
import pytest

from hpclab import backend, roofline as R
from hpclab.results import plot


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fma_kernel_runs_the_chains_it_counts(dtype):
    """Every chain is x <- x a + b, passes x STEPS times, from x = c + thread % 7; out = sum over chains."""
    out, passes, a, b = R.cuda.device_array(9, dtype), 2, dtype(0.9), dtype(0.25)
    R.fma_kernel(np.dtype(dtype))[1, 9](out, passes, a, b)
    x = (np.arange(R.CHAINS)[:, None] + np.arange(9) % 7).astype(np.float64)
    for _ in range(passes * R.STEPS):
        x = x * float(a) + float(b)
    np.testing.assert_allclose(out.copy_to_host(), x.sum(axis=0), rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_copy_kernel_copies_every_element():
    src = R.cuda.to_device(np.arange(1000.0))
    dst = R.cuda.device_array_like(src)
    R.copy_kernel[2, 32](src, dst)
    np.testing.assert_array_equal(dst.copy_to_host(), np.arange(1000.0))


def test_measured_roofs_count_what_their_kernels_do():
    from hpclab.launch import full_gpu

    fp32, fp64, copy = R.measure_roofs(repeats=1)
    threads = np.prod(full_gpu(1 << 40))
    assert [fp32.kernel, fp64.kernel, copy.kernel] == list(R.ROOFS)
    passes = backend.auto_size(gpu=1024, sim=1)          # passes of STEPS multiply-adds per chain
    assert fp32.flops == fp64.flops == 2 * R.CHAINS * R.STEPS * passes * threads and fp32.bytes == 0
    assert copy.flops == 0 and copy.bytes == 2 * 8 * backend.auto_size(gpu=1 << 26, sim=1 << 10)
    assert all(p.seconds > 0 and p.rate > 0 for p in (fp32, fp64, copy))


def test_gemm_counts_follow_the_tiles():
    """A tile of C reads its rows of A and its columns of B: one output per thread reads 2mnk floats,
    T x T tiles 2mnk / T, one tile of all C each input once; C is written once."""
    m, n, k = 64, 48, 40
    flops, naive = R.gemm_count(m, n, k, 1, 1)
    assert flops == 2 * m * n * k and naive == 4 * (2 * m * n * k + m * n)
    assert R.gemm_count(m, n, k, 32, 32)[1] == 4 * (2 * m * n * k / 32 + m * n)
    assert R.gemm_count(m, n, k, m, n)[1] == pytest.approx(4 * (m * k + k * n + m * n))


def test_matmul_points_place_each_rung_by_its_tiles():
    from hpclab.matmul import tiled
    from hpclab.matmul.measure import roofline_points

    n = 256       # above every tile size, the GPU's 128 x 128 too (a tile of all C reads each input once)
    pts = {p.kernel: p for p in roofline_points(n, {"naive": 1e-6, "tiled": 2e-6, "fast": 3e-6, "warp": 4e-6,
                                                    "cuBLAS": 5e-6})}
    assert pts["naive"].intensity == pytest.approx(2 * n ** 3 / (4 * (2 * n ** 3 + n ** 2)))
    assert pts["tiled"].bytes == R.gemm_count(n, n, n, tiled.TILE, tiled.TILE)[1]
    assert pts["cuBLAS"].bytes < pts["warp"].bytes <= pts["fast"].bytes <= pts["tiled"].bytes < pts["naive"].bytes
    assert pts["warp"].rate == pytest.approx(4e-6 * 1e12) and all(p.notebook == "04" for p in pts.values())


def test_conv_counts():
    from hpclab.halo.measure import conv_traffic

    flops, naive, _ = conv_traffic("naive", 2, 3, 9, 4, 5, 2)
    assert flops == 2 * 2 * 4 * 3 * 25 * 81 and naive == 4 * flops     # an input and a weight per MAC
    once = conv_traffic("cuDNN", 2, 3, 9, 4, 5, 2)[1]
    assert once == 4 * (2 * 3 * 81 + 4 * 3 * 25 + 2 * 4 * 81)
    assert once < conv_traffic("gemm", 2, 3, 9, 4, 5, 2)[1] < naive


def test_conv_points_carry_their_counts_and_times():
    from hpclab.halo.measure import conv_traffic, roofline_points

    for p in roofline_points(repeats=1):
        flops, nbytes, how = conv_traffic(p.kernel, 1, 4, 7, 8, 5, 2) if backend.is_simulator() else \
            conv_traffic(p.kernel, 32, 96, 27, 256, 5, 2)
        assert (p.flops, p.bytes, p.count, p.notebook) == (flops, nbytes, how, "06")
        assert isinstance(p.seconds, float) and p.seconds > 0


def test_pi_points_count_one_atomic_per_block():
    from hpclab.launch import full_gpu
    from hpclab.pi.measure import roofline_points

    midpoint, fast = roofline_points(bins=512, repeats=1)
    assert (midpoint.kernel, fast.kernel) == ("midpoint", "fast") and midpoint.notebook == "02"
    assert midpoint.flops == 6 * 512 and fast.flops == 29 * 128 and midpoint.bytes == 8 * full_gpu(512)[0]


def test_datasheet_names_the_sxm_parts_only():
    assert R.datasheet("NVIDIA H100 80GB HBM3")[:3] == (67e12, 34e12, 3.35e12)
    assert R.datasheet("NVIDIA H200")[2] == 4.8e12
    assert R.datasheet("NVIDIA H100 PCIe") is None and R.datasheet("NVIDIA H200 NVL") is None


def test_recorded_points_are_gpu_runs_of_the_notebooks_kernels():
    pts = R.read()
    devices = {p.device for p in pts}
    assert devices and all(R.datasheet(d) for d in devices), devices          # H100 / H200 SXM runs
    assert all(p.seconds > 0 and p.flops > 0 for p in pts if p.kernel not in R.ROOFS)
    for notebook, kernels in (("04", {"naive", "tiled", "fast", "warp", "cuBLAS"}),
                              ("06", {"naive", "direct", "gemm", "winograd"})):
        for device in devices:
            assert kernels <= {p.kernel for p in pts if p.notebook == notebook and p.device == device}


@pytest.mark.parametrize("notebook", ["02", "04", "06"])
def test_the_simulator_shows_recorded_points(notebook):
    fig = R.show(None, notebook, f"notebook {notebook}")
    recorded = {p.device for p in R.read() if p.notebook == notebook}     # a panel each, else H100 and H200's roofs
    assert len(fig.axes) == (len(recorded) or 2) and plot.png(fig)[:4] == b"\x89PNG"
    assert "simulator" in fig.texts[-1].get_text() or "No GPU run" in fig.texts[-1].get_text()


def test_split_k_points_are_checked_and_count_the_workspace(monkeypatch):
    from hpclab.matmul import measure, warp

    monkeypatch.setattr(warp, "plan", lambda m, n, k: (warp.CONFIG, 2))      # the simulator's plan never splits
    whole, split = measure.split_k_points(8, 8, 64, repeats=1)[:2]          # (and cuBLAS on a GPU)
    assert whole.flops == split.flops == 2.0 * 8 * 8 * 64 and whole.notebook == split.notebook == "04-split"
    assert split.bytes - whole.bytes == 8.0 * 2 * 8 * 8                     # two layers written and read once
    assert "x 1 slices of K" in whole.count and "x 2 slices of K" in split.count
