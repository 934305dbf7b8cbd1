"""The roofline: the roof kernels against NumPy, the counts, the recorded points and the figure."""
from __future__ import annotations

import io

import numpy as np
import pytest

from hpclab import backend, plot, roofline as R


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
    assert fp32.flops == fp64.flops == 2 * R.CHAINS * R.STEPS * threads and fp32.bytes == 0
    assert copy.flops == 0 and copy.bytes == 2 * 8 * backend.auto_size(gpu=1 << 26, sim=1 << 10)
    assert all(p.seconds > 0 and p.rate > 0 for p in (fp32, fp64, copy))


def test_matmul_counts_follow_the_loops():
    from hpclab.matmul import tiled

    m, n, k = 64, 48, 40
    flops, naive, _ = R.matmul_count("naive", m, n, k)
    assert flops == 2 * m * n * k and naive == 4 * (2 * m * n * k + m * n)
    assert R.matmul_count("tiled", m, n, k)[1] == 4 * (2 * m * n * k / tiled.TILE + m * n)
    assert R.matmul_count("cuBLAS", m, n, k)[1] == 4 * (m * k + k * n + m * n)
    # a block tile reads BM x k of A and k x BN of B: less than the tiled kernel's per output
    fast = R.matmul_count("fast", m, n, k)[1]
    assert R.matmul_count("cuBLAS", m, n, k)[1] < fast < naive


def test_conv_counts():
    flops, naive, _ = R.conv_count("naive", 2, 3, 9, 4, 5, 2)
    assert flops == 2 * 2 * 4 * 3 * 25 * 81 and naive == 4 * flops     # an input and a weight per MAC
    once = R.conv_count("cuDNN", 2, 3, 9, 4, 5, 2)[1]
    assert once == 4 * (2 * 3 * 81 + 4 * 3 * 25 + 2 * 4 * 81)
    assert once < R.conv_count("direct", 2, 3, 9, 4, 5, 2)[1] < naive
    assert once < R.conv_count("gemm", 2, 3, 9, 4, 5, 2)[1] < naive


def test_pi_counts_one_atomic_per_block():
    flops, nbytes, _ = R.pi_count("midpoint", 4000, 2)
    assert flops == 6 * 4000 and nbytes == 16
    assert R.pi_count("fast", 4000, 2)[0] == 29 * 1000


def test_points_on_this_backend_and_csv_round_trip():
    points = R.pi_points(bins=512, repeats=1)
    assert [p.kernel for p in points] == ["midpoint", "fast"] and all(p.notebook == "02" for p in points)
    rates = {"naive": 1e-6, "cuBLAS": 2e-6}
    mm = R.matmul_points(16, rates)
    assert [round(p.flops / p.seconds / 1e12, 12) for p in mm] == [1e-6, 2e-6]
    buf = io.StringIO()
    R.write(points + mm, buf)
    again = R.read(buf.getvalue())
    assert [(p.kernel, p.notebook, p.count) for p in again] == [(p.kernel, p.notebook, p.count) for p in points + mm]
    assert [p.flops for p in again] == pytest.approx([p.flops for p in points + mm], rel=1e-6)


def test_datasheet_names_the_sxm_parts_only():
    assert R.datasheet("NVIDIA H100 80GB HBM3")[:3] == (67e12, 34e12, 3.35e12)
    assert R.datasheet("NVIDIA H200")[2] == 4.8e12
    assert R.datasheet("NVIDIA H100 PCIe") is None and R.datasheet("NVIDIA H200 NVL") is None


def test_recorded_points_are_gpu_runs_of_the_notebooks_kernels():
    pts = R.read()
    assert {p.device for p in pts} >= {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    assert all(p.seconds > 0 and p.flops > 0 for p in pts if p.kernel not in R.ROOFS)
    for notebook, kernels in (("04", {"naive", "tiled", "fast", "warp", "cuBLAS"}),
                              ("06", {"naive", "direct", "gemm", "winograd"})):
        for device in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
            assert kernels <= {p.kernel for p in pts if p.notebook == notebook and p.device == device}


@pytest.mark.parametrize("notebook", ["02", "04", "06"])
def test_the_simulator_shows_recorded_points(notebook):
    fig = R.show(None, notebook, f"notebook {notebook}")
    assert len(fig.axes) >= 2 and plot.png(fig)[:4] == b"\x89PNG"
    assert "simulator" in fig.texts[-1].get_text() or "No GPU run" in fig.texts[-1].get_text()
