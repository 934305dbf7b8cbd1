"""AlexNet's trunk (Krizhevsky, Sutskever, Hinton 2012) with seeded random weights.

Blocks 1 and 2 are the core of the height-wise decomposition: C1 96@11x11/4 on 3x227x227 + ReLU +
max-pool 3x3/2, and C2 256@5x5 pad 2 + ReLU + max-pool + LRN. C3-C5 (3x3 pad 1, pool after C5) and
the fully connected FC6-FC8 complete the forward pass. The layer table's shapes, FLOPs, bytes and
halo rows are computed from the layer definitions. ``scale`` shrinks channels and FC widths.
"""
from __future__ import annotations

import numpy as np

from hpclab.halo.layers import LRN, Conv, Dense, Pool, shapes
from hpclab.halo.geometry import plan_bands
from hpclab.halo.reference import conv_flops

# name: (out channels, kernel, stride, pad) of the convolutions; which blocks pool / normalise.
CONVS = {"c1": (96, 11, 4, 0), "c2": (256, 5, 1, 2), "c3": (384, 3, 1, 1), "c4": (384, 3, 1, 1), "c5": (256, 3, 1, 1)}
POOL_AFTER = {"c1", "c2", "c5"}
LRN_AFTER = {"c2"}
FCS = [("fc6", 4096, True), ("fc7", 4096, True), ("fc8", 1000, False)]
INPUT = (3, 227, 227)
LAYERS = ("c1", "c2", "c3", "c4", "c5", "trunk")


def channels(scale: int) -> dict[str, int]:
    """Output channels per convolution (divided by ``scale``, at least 4)."""
    return {name: max(4, k // scale) for name, (k, *_) in CONVS.items()}


def _weights(rng, shape, fan_in):
    # Uniform with the variance of He initialisation: activations stay O(1) through ReLUs.
    bound = np.sqrt(6.0 / fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def conv_ops(name: str, c_in: int, scale: int = 1, seed: int = 0) -> list:
    """The ops of block ``name``: the convolution (+ReLU), then pool / LRN where AlexNet has them."""
    if name not in CONVS:
        raise ValueError(f"unknown layer {name!r}; choose one of {', '.join(LAYERS)}")
    _, r, s, p = CONVS[name]
    k = channels(scale)[name]
    rng = np.random.default_rng([seed, list(CONVS).index(name)])
    ops = [Conv(name, _weights(rng, (k, c_in, r, r), c_in * r * r),
                rng.uniform(-0.1, 0.1, k).astype(np.float32), s, p, relu=True)]
    if name in POOL_AFTER:
        ops.append(Pool(f"pool{name[1:]}", 3, 2))
    if name in LRN_AFTER:
        ops.append(LRN(f"lrn{name[1:]}"))
    return ops


def input_channels(name: str, scale: int = 1) -> int:
    """Channels entering block ``name`` (3 for c1)."""
    names = list(CONVS)
    return INPUT[0] if name == "c1" else channels(scale)[names[names.index(name) - 1]]


def trunk_ops(scale: int = 1, seed: int = 0) -> list:
    """C1-C5, each with its pooling and LRN."""
    return [op for name in CONVS for op in conv_ops(name, input_channels(name, scale), scale, seed)]


def dense_ops(features: int, scale: int = 1, seed: int = 0) -> list[Dense]:
    """FC6-FC8 for ``features`` inputs (256 x 6 x 6 = 9216 at full size)."""
    ops, d = [], features
    for i, (name, m, relu) in enumerate(FCS):
        m = m if name == "fc8" and scale == 1 else max(8, m // scale)
        rng = np.random.default_rng([seed, 100 + i])
        ops.append(Dense(name, _weights(rng, (m, d), d), rng.uniform(-0.1, 0.1, m).astype(np.float32), relu))
        d = m
    return ops


def layer_table(ops, in_shape, batch: int = 1, ranks: int = 1, dense=()) -> list[dict]:
    """Shapes, FLOPs, bytes (float32 input + output + weights) and halo rows per rank."""
    rows, outs = [], shapes(ops, in_shape)
    for op, (c, h, w), (k, ho, wo) in zip(ops, [tuple(in_shape), *outs], outs):
        weights = 0
        if isinstance(op, Conv):
            _, _, r, s = op.w.shape
            flops = conv_flops(batch, k, c, r, s, ho, wo)
            weights = op.w.size + op.bias.size
        elif isinstance(op, Pool):
            flops = batch * k * ho * wo * (op.size * op.size - 1)     # comparisons
        else:
            flops = batch * c * h * w * (2 * op.size + 6)             # squares, sums, scale, power
        halos = ([(p.halo_above, p.halo_below) for p in plan_bands(h, *op.window, ranks)]
                 if op.window is not None and ho >= ranks else [])
        rows.append({"layer": op.name, "op": op.describe(), "input": [batch, c, h, w],
                     "output": [batch, k, ho, wo], "flops": int(flops),
                     "bytes": int(4 * (batch * (c * h * w + k * ho * wo) + weights)),
                     "halo_rows": halos})
    for op in dense:
        m, d = op.w.shape
        rows.append({"layer": op.name, "op": op.describe(), "input": [batch, d], "output": [batch, m],
                     "flops": 2 * batch * m * d, "bytes": int(4 * (batch * (m + d) + op.w.size + m)),
                     "halo_rows": []})
    return rows


def format_table(rows: list[dict]) -> str:
    head = (f"{'layer':<6} {'operation':<34} {'input':<20} {'output':<20} {'MFLOP':>10} {'MB':>8}  "
            "halo rows (above, below) per rank")
    lines = [head, "-" * len(head)]
    for r in rows:
        halos = " ".join(f"{a},{b}" for a, b in r["halo_rows"]) or "-"
        lines.append(f"{r['layer']:<6} {r['op'][:34]:<34} {'x'.join(map(str, r['input'])):<20} "
                     f"{'x'.join(map(str, r['output'])):<20} {r['flops'] / 1e6:>10.1f} "
                     f"{r['bytes'] / 1e6:>8.2f}  {halos}")
    return "\n".join(lines)
