"""What the convolution benchmarks share to compare our kernels with PyTorch's (cuDNN) on one GPU: timing
in turns, a timing row, PyTorch's TF32 switch, and a float64 convolution as the yardstick for rounding."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hpclab.timing import median_times


def gpu_times(fn, repeats: int, warmup: int = 2, queued: int = 10) -> tuple[float, float]:
    """(throughput, latency) seconds per call, medians timed in turns: ``queued`` calls back to back then
    one sync (the host queues the next call while the GPU runs this one, as in a forward pass), and one
    call then a sync (with the host's launch time). Ours and cuDNN's alike: PyTorch shares Numba's
    context, so the device synchronisation waits for both."""
    for _ in range(warmup):
        fn()
    batch, single = median_times(lambda: [fn() for _ in range(queued)], fn, repeats=repeats, warmup=0)
    return batch / queued, single


def timing_row(flops, secs, latency, err) -> dict:
    return {"seconds": secs, "tflops": flops / secs / 1e12, "latency_seconds": latency,
            "latency_tflops": flops / latency / 1e12, "max_rel_error_vs_float64": err}


def torch_precision(torch, tf32: bool) -> dict:
    """Let cuDNN convolutions and cuBLAS matmuls use TF32, or forbid it; read the settings back."""
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    seen = {"cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    try:  # PyTorch >= 2.9 also exposes the setting as a precision name
        seen["cudnn.conv.fp32_precision"] = torch.backends.cudnn.conv.fp32_precision
    except Exception:  # noqa: BLE001 - older PyTorch: the flags above are all there is
        pass
    return seen


def conv_float64(x, w, stride, pad):
    """Convolution in float64 (patches x weights through BLAS): the yardstick for rounding errors."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    r, s = w.shape[2:]
    win = sliding_window_view(xp, (r, s), axis=(2, 3))[:, :, ::stride, ::stride]   # (N, C, P, Q, R, S)
    return np.einsum("ncpqrs,kcrs->nkpq", win, w.astype(np.float64), optimize=True)
