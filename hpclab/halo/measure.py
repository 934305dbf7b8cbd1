"""What notebook 06 measures of the convolution methods on a rank's GPU: AlexNet's C2 by each method (and
cuDNN where PyTorch is), as points on the roofline; the full benchmark is ``benchmarks/conv.py``."""
from __future__ import annotations

import numpy as np

from hpclab import backend, roofline
from hpclab.halo import conv as kc
from hpclab.matmul import warp
from hpclab.timing import median_time


def c2_operands(batch: int) -> tuple[np.ndarray, np.ndarray]:
    """AlexNet's C2 (96 -> 256 channels, 27 x 27, 5 x 5, pad 2; tiny on the simulator): input
    (batch, 96, 27, 27) and weights (256, 96, 5, 5), uniform from a fixed seed."""
    n, c, h, k = (1, 4, 7, 8) if backend.is_simulator() else (batch, 96, 27, 256)
    rng = np.random.default_rng(0)
    return rng.uniform(-1, 1, (n, c, h, h)).astype(np.float32), rng.uniform(-0.1, 0.1, (k, c, 5, 5)).astype(np.float32)


def conv_traffic(method: str, n: int, c: int, h: int, k: int, r: int, pad: int) -> tuple[float, float, str]:
    """FLOPs (2 n k c r r ho ho) and bytes, no cache, of a stride-1 convolution (n, c, h, h) by (k, c, r, r):
    naive, an input and a weight per multiply-add; gemm, im2col's matrix written and read, the GEMM's tiles,
    the scatter; others, each array once (``benchmarks/conv_direct.py`` counts the tiled direct kernel's)."""
    ho = h + 2 * pad - r + 1
    flops, pq, crs = 2.0 * n * k * c * r * r * ho * ho, n * ho * ho, c * r * r
    if method == "naive":
        return flops, 4.0 * flops, "no reuse"
    if method == "gemm":
        cfg = warp.plan(k, pq, crs)[0]          # the tile shape conv_gemm multiplies in
        tiles = roofline.gemm_count(k, pq, crs, cfg.bm, cfg.bn)[1]
        return flops, 8.0 * crs * pq + tiles + 8.0 * k * pq, "im2col + tiles"
    return flops, 4.0 * (n * c * h * h + k * crs + k * pq), "each array once"


def roofline_points(batch: int | None = None, repeats: int = 3) -> list:
    """Notebook 06's roofline: AlexNet's C2 (96 -> 256, 27 x 27, 5 x 5, pad 2) by each method; cuDNN (TF32 off)."""
    cuda = kc.cuda
    xh, wt = c2_operands(batch or 32)
    (n, c, h, _), k = xh.shape, wt.shape[0]
    x, weights, out = cuda.to_device(xh), kc.ConvWeights(wt), cuda.device_array((n, k, h, h), np.float32)
    timed = {m: median_time(lambda: kc.conv2d_device(x, weights, 1, 2, out=out, method=m), repeats)  # noqa: B023
             for m in kc.METHODS}
    try:    # PyTorch shares Numba's context: median_time's synchronize waits for both
        import torch

        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = False, True
        tx, tw = torch.as_tensor(xh).cuda(), torch.as_tensor(wt).cuda()
        timed["cuDNN"] = median_time(lambda: torch.nn.functional.conv2d(tx, tw, padding=2), repeats, warmup=3)
    except Exception:  # noqa: BLE001 - no PyTorch or no cuDNN: no cuDNN point
        pass
    points = []
    for m, t in timed.items():
        flops, nbytes, how = conv_traffic(m, n, c, h, k, 5, 2)
        points.append(roofline.point(m, flops, nbytes, t, how, "06"))
    return points
