"""What notebook 04 measures of the matmul kernels on a rank's GPU: TFLOP/s against cuBLAS and the FP32 peak,
and their points on the roofline (``benchmarks/matmul.py`` runs the full sweep of tile shapes)."""
from __future__ import annotations

import numpy as np

from hpclab import backend
from hpclab.device import identity
from hpclab.timing import median_time

KNOWN_BOOST_GHZ = {"H100": 1.98, "H200": 1.98, "A100": 1.41}   # if the driver does not say
FP32_LANES_PER_SM = {(7, 0): 64, (8, 0): 64}   # others (Turing excepted) have 128


def _attr(dev, name: str, default=None):
    try:
        return getattr(dev, name)
    except Exception:  # noqa: BLE001 - attributes come and go between CUDA versions
        return default


def device_info(cuda) -> dict:
    """Name, SMs, clock and the FP32 peak they imply (FMA = 2 flops per lane per clock)."""
    if backend.is_simulator():
        return {"name": "Numba CUDA simulator", "fp32_peak_tflops": None}
    dev, name = cuda.get_current_device(), identity()[0]
    cc = tuple(dev.compute_capability)
    sms = _attr(dev, "MULTIPROCESSOR_COUNT", 0)
    clock_khz = _attr(dev, "CLOCK_RATE")          # the boost clock; deprecated in newer CUDA
    clock_ghz = clock_khz / 1e6 if clock_khz else \
        KNOWN_BOOST_GHZ.get(next((k for k in KNOWN_BOOST_GHZ if k in name), ""), 0.0)
    lanes = FP32_LANES_PER_SM.get(cc, 64 if cc[0] == 7 else 128)
    return {"name": name, "compute_capability": f"{cc[0]}.{cc[1]}", "sms": sms, "clock_ghz": clock_ghz,
            "fp32_lanes_per_sm": lanes,
            "fp32_peak_tflops": 2 * lanes * sms * clock_ghz / 1e3 if sms and clock_ghz else None}


def operands(cuda, m: int, n: int, k: int):
    """(rng, A, B, A, B, C): uniform float32 A (m x k) and B (k x n) from seed n on the host, then A, B and an
    empty C on the device; ``rng`` goes on (``benchmarks/matmul.py`` samples rows with it for its check)."""
    rng = np.random.default_rng(n)
    a_h, b_h = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((m, k), (k, n)))
    return rng, a_h, b_h, cuda.to_device(a_h), cuda.to_device(b_h), cuda.device_array((m, n), dtype=np.float32)


def measure(n: int, repeats: int = 3) -> dict[str, float]:
    """TFLOP/s of each kernel in its default configuration (the notebook's chart), and of cuBLAS when CuPy
    works, for one n x n float32 product."""
    backend.select()
    from hpclab.matmul import fast as mm

    _, _, _, a, b, c = operands(mm.cuda, n, n, n)
    flop = mm.flops(n, n, n)
    out = {}
    for kernel in mm.LADDER:
        t = median_time(lambda: mm.launch(kernel, a, b, c), repeats=repeats, warmup=1)  # noqa: B023
        out[kernel] = flop / t / 1e12
    t = cublas_seconds(a, b, repeats)
    if t:
        out["cuBLAS"] = flop / t / 1e12
    return out


def cublas_seconds(a, b, repeats: int) -> float | None:
    """Median seconds of cuBLAS's a @ b through CuPy; None on the simulator or without CuPy."""
    if backend.is_simulator():
        return None
    try:
        import cupy as cp
    except Exception:  # noqa: BLE001 - no CuPy: no cuBLAS figure
        return None
    a_cp, b_cp = cp.asarray(a), cp.asarray(b)
    return median_time(lambda: cp.matmul(a_cp, b_cp), repeats=repeats, warmup=2)


def roofline_points(n: int, rates: dict[str, float]) -> list:
    """Notebook 04's roofline: ``measure(n)``'s TFLOP/s, each kernel placed by its tiles of C
    (:func:`hpclab.roofline.gemm_count`); cuBLAS as if it read each input once (one tile of all C)."""
    from hpclab import roofline
    from hpclab.matmul import fast, tiled, warp

    cfg = fast.fast_config(np.float32)
    tiles = {"naive": (1, 1, "no reuse"), "tiled": (tiled.TILE, tiled.TILE, f"{tiled.TILE}x{tiled.TILE} tiles"),
             "fast": (cfg.bm, cfg.bn, f"{cfg.bm}x{cfg.bn} block tiles"), "cuBLAS": (n, n, "each input once"),
             "warp": (warp.CONFIG.bm, warp.CONFIG.bn, f"{warp.CONFIG.bm}x{warp.CONFIG.bn} block tiles")}
    return [roofline.point(kernel, *roofline.gemm_count(n, n, n, *tiles[kernel][:2]), 2.0 * n ** 3 / (tflops * 1e12),
                           tiles[kernel][2], "04") for kernel, tflops in rates.items()]


def split_k_points(m: int = 333, n: int = 777, k: int = 9000, repeats: int = 5) -> list:
    """Notebook 04's split-K rung on the roofline, at a small output with a deep K: the warp kernel in its
    128 x 128 tiles with K whole, the same kernel as :func:`hpclab.matmul.warp.plan` runs it (tile shape and
    slices of K), and cuBLAS when CuPy works. The split's count adds the slices' workspace, written once and
    read once. Each result is checked against NumPy's float64 product first."""
    from hpclab import roofline
    from hpclab.matmul import check, warp

    _, a_h, b_h, a, b, c = operands(warp.cuda, m, n, k)
    cfg, split = warp.plan(m, n, k)
    runs = {"warp, K whole": (warp.CONFIG, 1), "warp, split-K": (cfg, split)}
    points = []
    for name, (tiles, slices) in runs.items():
        launch = lambda: warp.launch(a, b, c, tiles, split=slices)  # noqa: E731, B023
        launch()
        verdict = check.product(c.copy_to_host(), a_h, b_h, quiet=True)
        if not verdict:
            raise AssertionError(f"{name}, {m} x {n} x {k}: {verdict.message}")
        blocks = -(-m // tiles.bm) * -(-n // tiles.bn) * slices
        flops, nbytes = roofline.gemm_count(m, n, k, tiles.bm, tiles.bn)
        points.append(roofline.point(name, flops, nbytes + (8.0 * slices * m * n if slices > 1 else 0.0),
                                     median_time(launch, repeats=repeats, warmup=1),
                                     f"{tiles.bm}x{tiles.bn} tiles x {slices} slices of K = {blocks} blocks", "04-split"))
    t = cublas_seconds(a, b, repeats)
    if t:
        points.append(roofline.point("cuBLAS", *roofline.gemm_count(m, n, k, m, n), t, "each input once", "04-split"))
    return points
