"""NumPy references for the convolution layers, and the shape/argument checks.

The convolution is a cross-correlation, as deep-learning frameworks define it:
``out[n, k, i, j] = sum_{c, r, s} w[k, c, r, s] * x[n, c, i*stride - pad + r, j*stride - pad + s]``
with zeros outside the image. ``conv2d_rows`` sums over (c, r, s) in a fixed order, element-wise
in float32, so a band of rows computed on its own gives the same bits as those rows of the whole
image: the CPU versions of the distributed code can be compared to the serial one bit for bit.
"""
from __future__ import annotations

import numpy as np

# AlexNet's local response normalisation (Krizhevsky et al. 2012, section 3.3):
# b = a / (k + alpha * sum of a^2 over `size` neighbouring channels) ** beta.
# (PyTorch's LocalResponseNorm divides alpha by size; this is the paper's form.)
LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_K = 5, 1e-4, 0.75, 2.0


def output_size(n: int, kernel: int, stride: int, pad: int) -> int:
    """Output length of a window of ``kernel`` sliding with ``stride`` over n + 2 pad."""
    return (n + 2 * pad - kernel) // stride + 1


def check_window(h: int, w: int, r: int, s: int, stride: int, pad: int, what: str = "kernel") -> tuple[int, int]:
    """The output (height, width), or a ValueError naming the problem and the fix for a bad window geometry."""
    for name, value in (("stride", stride), ("padding", pad)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
    if stride < 1:
        raise ValueError(f"stride must be at least 1, got {stride}; use stride=1 for a dense convolution")
    if pad < 0:
        raise ValueError(f"padding must be zero or positive, got {pad}")
    if r > h + 2 * pad or s > w + 2 * pad:
        raise ValueError(
            f"{what} {r}x{s} is larger than the padded input {h + 2 * pad}x{w + 2 * pad} "
            f"(input {h}x{w} with padding {pad}); use a smaller {what}, more padding or a larger input")
    return output_size(h, r, stride, pad), output_size(w, s, stride, pad)


def check_conv(x_shape, w_shape, stride: int, pad: int) -> tuple[int, int]:
    """Validate conv2d arguments; return the output (height, width)."""
    if len(x_shape) not in (3, 4):
        raise ValueError(f"input must have shape (C, H, W) or (N, C, H, W), got {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"weights must have shape (K, C, R, S), got {tuple(w_shape)}")
    c, h, w = x_shape[-3:]
    k, wc, r, s = w_shape
    if wc != c:
        raise ValueError(
            f"the input has {c} channels but the weights expect {wc} (weights shape {tuple(w_shape)} "
            f"is (K, C, R, S)); give weights with C = {c}")
    if min(x_shape) < 1 or min(w_shape) < 1:
        raise ValueError(f"empty input {tuple(x_shape)} or weights {tuple(w_shape)}")
    return check_window(h, w, r, s, stride, pad)


def as_batch(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(N, C, H, W) view of x, and whether x had no batch axis."""
    x = np.asarray(x)
    return (x[None], True) if x.ndim == 3 else (x, False)


def _padded(x, rows: int, pad_top: int, pad_w: int, fill: float) -> np.ndarray:
    """The band x (N, C, h, W) with ``pad_top`` rows above, ``pad_w`` columns each side and as many
    rows below as ``rows`` need, all ``fill``."""
    n, c, h, wd = x.shape
    xp = np.full((n, c, max(pad_top + h, rows), wd + 2 * pad_w), fill, dtype=np.float32)
    xp[:, :, pad_top:pad_top + h, pad_w:pad_w + wd] = x
    return xp


def conv2d_rows(x, w, stride: int, pad_top: int, pad_w: int, out_rows: int, bias=None) -> np.ndarray:
    """Output rows 0..out_rows-1 of a convolution of a (N, C, h, W) band: input row ``i * stride - pad_top + r``
    feeds output row i; rows outside [0, h) are zero (padding, or rows beyond the image edge)."""
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w, dtype=np.float32)
    k, c, r, s = w.shape
    wo = output_size(x.shape[3], s, stride, pad_w)
    xp = _padded(x, (out_rows - 1) * stride + r, pad_top, pad_w, 0.0)
    out = np.zeros((x.shape[0], k, out_rows, wo), dtype=np.float32)
    for ci in range(c):
        for ri in range(r):
            for si in range(s):
                patch = xp[:, ci, ri:ri + (out_rows - 1) * stride + 1:stride, si:si + (wo - 1) * stride + 1:stride]
                out += w[None, :, ci, ri, si, None, None] * patch[:, None]
    if bias is not None:
        out += np.asarray(bias, dtype=np.float32)[None, :, None, None]
    return out


def conv2d(x, w, stride: int = 1, pad: int = 0, bias=None) -> np.ndarray:
    """Reference 2-D convolution (cross-correlation) of (C,H,W) or (N,C,H,W) input."""
    x4, single = as_batch(x)
    ho, _ = check_conv(np.shape(x), np.shape(w), stride, pad)
    out = conv2d_rows(x4, w, stride, pad, pad, ho, bias)
    return out[0] if single else out


def relu(x) -> np.ndarray:
    return np.maximum(np.asarray(x, dtype=np.float32), np.float32(0))


def maxpool_rows(x, size: int, stride: int, pad_top: int, out_rows: int, pad_w: int = 0) -> np.ndarray:
    """Rows 0..out_rows-1 of a size x size max-pooling of a (N, C, h, W) band (-inf outside)."""
    x = np.asarray(x, dtype=np.float32)
    wo = output_size(x.shape[3], size, stride, pad_w)
    xp = _padded(x, (out_rows - 1) * stride + size, pad_top, pad_w, -np.inf)
    out = np.full((*x.shape[:2], out_rows, wo), -np.inf, dtype=np.float32)
    for ri in range(size):
        for si in range(size):
            np.maximum(out, xp[:, :, ri:ri + (out_rows - 1) * stride + 1:stride,
                               si:si + (wo - 1) * stride + 1:stride], out=out)
    return out


def lrn(x, size: int = LRN_SIZE, alpha: float = LRN_ALPHA, beta: float = LRN_BETA,
        k: float = LRN_K) -> np.ndarray:
    """Local response normalisation across the channels of x (N, C, H, W) (AlexNet's form), float32."""
    x = np.asarray(x, dtype=np.float32)
    sq, half = x * x, size // 2
    total = np.stack([sq[:, max(0, ci - half):ci + half + 1].sum(axis=1, dtype=np.float32)
                      for ci in range(x.shape[1])], axis=1)
    return x / (np.float32(k) + np.float32(alpha) * total) ** np.float32(beta)


def linear(x, w, bias=None) -> np.ndarray:
    """Fully connected layer: x (N, D) times w (M, D) transposed, plus bias."""
    out = np.asarray(x, dtype=np.float32) @ np.asarray(w, dtype=np.float32).T
    return out if bias is None else out + np.asarray(bias, dtype=np.float32)


def conv_flops(n: int, k: int, c: int, r: int, s: int, ho: int, wo: int) -> int:
    """Multiply-adds counted as two operations: 2 N K C R S Ho Wo."""
    return 2 * n * k * c * r * s * ho * wo
