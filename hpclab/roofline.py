"""The roofline of the GPU in use, and where each kernel of a notebook sits under it.

A kernel doing F floating-point operations and moving B bytes of device memory in T seconds has
arithmetic intensity I = F / B and attains F / T, below both roofs: the peak rate P, and I times
the memory bandwidth W. On log-log axes min(P, I W) is the roofline, its knee at I = P / W.
Both roofs are measured, beside the datasheet's: ``fma_kernel`` (CHAINS independent chains of
fused multiply-adds per thread, STEPS written out per pass so that loop instructions take few
issue slots; float32 and float64) and ``copy_kernel`` (512 MiB copied: read once, written once).
FLOPs and bytes of a kernel are counted from its loops, assuming no cache (``*_count``).
``python -m hpclab.roofline FILE`` records roofs and the kernels of notebooks 02, 04 and 06
on a GPU in the format of ``data/roofline.csv``, which the notebooks show on the simulator.
"""
from __future__ import annotations

import csv
import datetime
import io
import re
import sys
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources

import numpy as np

from hpclab import backend
from hpclab import plot  # the figure helpers (one import to change if they move)

cuda = backend.cuda()       # module level: the simulator swaps this name inside kernels
CHAINS, STEPS = 8, 16
# (device name pattern, FP32 and FP64 (no tensor cores) FLOP/s, memory bytes/s, source)
DATASHEET = [(r"H100 80GB HBM3$", 67e12, 34e12, 3.35e12, "NVIDIA H100 datasheet, SXM (nvidia.com/en-us/data-center/h100)"),
             (r"H200$", 67e12, 34e12, 4.8e12, "NVIDIA H200 datasheet, SXM (nvidia.com/en-us/data-center/h200)")]
ROOFS = ("roof: FP32 FMA", "roof: FP64 FMA", "roof: memory copy")


@dataclass
class Point:
    """One timed kernel: counted FLOPs and bytes, median seconds, the count's model, where and when."""
    kernel: str
    flops: float
    bytes: float
    seconds: float
    count: str = ""
    notebook: str = ""
    device: str = ""
    date: str = ""
    command: str = ""

    rate = property(lambda self: (self.flops or self.bytes) / self.seconds)      # FLOP/s, or B/s for the copy
    intensity = property(lambda self: self.flops / self.bytes)                 # FLOP per byte


def datasheet(device: str):
    """(FP32, FP64, bandwidth, source) of this device's datasheet, or None."""
    return next((row[1:] for row in DATASHEET if re.search(row[0], device)), None)


def _point(kernel: str, counted: tuple, seconds: float, notebook: str) -> Point:
    from hpclab.matmul.bench import device_info
    return Point(kernel, *counted[:2], seconds, counted[2], notebook, device_info(cuda)["name"],
                 datetime.date.today().isoformat())


@lru_cache(maxsize=None)
def fma_kernel(dtype):
    from numba import from_dtype   # after the backend is chosen
    nbt = from_dtype(np.dtype(dtype))

    @cuda.jit
    def fma(out, passes, a, b):
        x = cuda.local.array(CHAINS, nbt)
        for c in range(CHAINS):
            x[c] = nbt(c + cuda.threadIdx.x % 7)
        for _ in range(passes):
            for _ in range(STEPS):
                for c in range(CHAINS):       # CHAINS independent multiply-adds in flight
                    x[c] = cuda.fma(x[c], a, b)
        s = nbt(0)
        for c in range(CHAINS):
            s += x[c]
        out[cuda.grid(1)] = s                 # stored, so the chains cannot be optimised away

    return fma


@cuda.jit
def copy_kernel(src, dst):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        dst[i] = src[i]


def measure_roofs(repeats: int = 5) -> list[Point]:
    """The GPU's FP32 and FP64 multiply-add rates and its copy bandwidth, each a timed kernel."""
    from hpclab.launch import full_gpu
    from hpclab.timing import median_time

    blocks, threads = full_gpu(1 << 40)         # every thread the GPU holds at once
    passes, words = (1, 1 << 10) if backend.is_simulator() else (4096, 1 << 26)
    out, flops = [], 2.0 * CHAINS * STEPS * passes * blocks * threads
    for dtype, name in ((np.float32, ROOFS[0]), (np.float64, ROOFS[1])):
        res, k = cuda.device_array(blocks * threads, dtype), fma_kernel(np.dtype(dtype))
        t = median_time(lambda: k[blocks, threads](res, passes, dtype(0.999), dtype(0.001)), repeats)  # noqa: B023
        out.append(_point(name, (flops, 0.0, f"{CHAINS} chains x {STEPS * passes} steps a thread"), t, ""))
    src = cuda.to_device(np.ones(words))
    dst = cuda.device_array_like(src)
    t = median_time(lambda: copy_kernel[blocks, threads](src, dst), repeats)
    return out + [_point(ROOFS[2], (0.0, 2.0 * src.nbytes, f"{src.nbytes >> 20} MiB read + written"), t, "")]


# ---------------------------------------------------------------- counts: (FLOPs, bytes, model)

def pi_count(kernel: str, bins: int, blocks: int) -> tuple:
    """Midpoint pi (float64): operations as the loop is written ((i+1/2)*h, x*x+1, 4/d, acc+=: 6 a bin;
    ``fast``: 29 per 4 bins), a division counted as one; memory: one 8-byte atomic per block."""
    per_bin = {"midpoint": 6.0, "fast": 29 / 4}[kernel]
    return per_bin * bins, 8.0 * blocks, f"{per_bin:g} FLOP a bin, 8 B a block"


def matmul_count(kernel: str, m: int, n: int, k: int) -> tuple:
    """C = A B (float32), 2mnk FLOPs. Floats read, no cache: naive, a row of A and a column of B per
    output (2mnk); tiled (T x T tiles), 2mnk / T; fast and warp (BM x BN block tiles), mnk (1/BM + 1/BN);
    cuBLAS, each input once (mk + kn). C written once (mn)."""
    from hpclab.matmul import fast, tiled, warp

    cfg = {"fast": fast.fast_config(np.float32), "warp": warp.CONFIG}.get(kernel)
    reads = {"naive": 2.0 * m * n * k, "tiled": 2.0 * m * n * k / tiled.TILE,
             "cuBLAS": float(m * k + k * n)}.get(kernel) or m * n * k * (1 / cfg.bm + 1 / cfg.bn)
    model = {"naive": "no reuse", "tiled": f"{tiled.TILE}x{tiled.TILE} tiles", "cuBLAS": "each input once"}
    return 2.0 * m * n * k, 4.0 * (reads + m * n), model.get(kernel) or f"{cfg.bm}x{cfg.bn} block tiles"


def conv_count(method: str, n: int, c: int, h: int, k: int, r: int, pad: int) -> tuple:
    """(n, c, h, h) by (k, c, r, r), stride 1: 2 n k c r r ho ho FLOPs. Floats moved, no cache: naive, an
    input and a weight per multiply-add; direct, per block tile its input rows with halo and weights;
    gemm, im2col's matrix written and read, the GEMM's block tiles, the scatter; the others each array once."""
    from hpclab.halo import conv_tiled
    from hpclab.matmul import fast

    ho = h + 2 * pad - r + 1
    flops, pq, crs = 2.0 * n * k * c * r * r * ho * ho, n * ho * ho, c * r * r
    if method == "naive":
        return flops, 4.0 * flops, "no reuse"
    if method == "direct":
        plan = conv_tiled.plan_tiles(c, ho, r, 1, conv_tiled.default_config(k))
        tiles = n * -(-ho // plan.th) * -(-ho // plan.tw) * -(-k // plan.config.bm)
        per_tile = c * r * (plan.th * plan.wwin + r * plan.config.bm)
        return flops, 4.0 * (tiles * per_tile + k * pq), f"{plan.th}x{plan.tw} px x {plan.config.bm} ch tiles"
    if method == "gemm":
        cfg = fast.fast_config(np.float32)
        return flops, 4.0 * (2 * crs * pq + k * pq * crs * (1 / cfg.bm + 1 / cfg.bn) + 3 * k * pq), "im2col + tiles"
    return flops, 4.0 * (n * c * h * h + k * crs + k * pq), "each array once"


# ---------------------------------------------------------------- the notebooks' kernels, timed

def pi_points(bins: int | None = None, repeats: int = 5) -> list[Point]:
    """Notebook 02: the midpoint kernel and the four-bins-per-division one."""
    from hpclab.launch import full_gpu
    from hpclab.pi import fast, midpoint
    from hpclab.timing import median_time

    bins = bins or backend.auto_size(gpu=10**11, sim=4000)
    return [_point(name, pi_count(name, bins, full_gpu(bins)[0]),
                   median_time(lambda: mod.partial_sum(0, bins, bins), repeats), "02")  # noqa: B023
            for name, mod in (("midpoint", midpoint), ("fast", fast))]


def matmul_points(n: int, rates: dict[str, float]) -> list[Point]:
    """Notebook 04: the TFLOP/s that ``matmul.bench.measure(n)`` timed, as points."""
    return [_point(kernel, matmul_count(kernel, n, n, n), 2.0 * n ** 3 / (tflops * 1e12), "04")
            for kernel, tflops in rates.items()]


def conv_points(batch: int | None = None, repeats: int = 3) -> list[Point]:
    """Notebook 06: AlexNet's C2 (96 -> 256 channels, 27 x 27, 5 x 5, pad 2) by each method, and cuDNN
    (FP32: TF32 off) when PyTorch is there."""
    from hpclab.halo import conv as kc
    from hpclab.timing import median_time

    n, c, h, k = (1, 4, 7, 8) if backend.is_simulator() else (batch or 32, 96, 27, 256)
    rng = np.random.default_rng(0)
    x = cuda.to_device(rng.uniform(-1, 1, (n, c, h, h)).astype(np.float32))
    wt = rng.uniform(-0.1, 0.1, (k, c, 5, 5)).astype(np.float32)
    weights, out = kc.ConvWeights(wt), cuda.device_array((n, k, h, h), np.float32)
    timed = {m: median_time(lambda: kc.conv2d_device(x, weights, 1, 2, out=out, method=m), repeats)  # noqa: B023
             for m in kc.METHODS}
    try:    # PyTorch shares Numba's context: median_time's synchronize waits for both
        import torch

        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = False, True
        tx, tw = torch.as_tensor(x.copy_to_host()).cuda(), torch.as_tensor(wt).cuda()
        timed["cuDNN"] = median_time(lambda: torch.nn.functional.conv2d(tx, tw, padding=2), repeats, warmup=3)
    except Exception:  # noqa: BLE001 - no PyTorch or no cuDNN: no cuDNN point
        pass
    return [_point(m, conv_count(m, n, c, h, k, 5, 2), t, "06") for m, t in timed.items()]


# ---------------------------------------------------------------- recorded points, the figure

def write(points: list[Point], fh) -> None:
    w = csv.DictWriter(fh, [f.name for f in fields(Point)])   # the columns of data/roofline.csv
    w.writeheader()
    w.writerows({k: (f"{v:.7g}" if isinstance(v, float) else v) for k, v in asdict(p).items()} for p in points)


def read(text: str | None = None) -> list[Point]:
    """Points of a CSV written by :func:`write`; by default the recorded ``data/roofline.csv``."""
    text = text if text is not None else resources.files("hpclab").joinpath("data/roofline.csv").read_text()
    return [Point(**{**r, **{k: float(r[k]) for k in ("flops", "bytes", "seconds")}})
            for r in csv.DictReader(io.StringIO(text))]


def figure(panels: dict[str, list[Point]], title: str, note: str | None = None, fp64: bool = False):
    """One log-log panel per device: measured roofs (solid), the datasheet's (dashed), the kernels."""
    fig, axes = plot._figure(6.4 * len(panels), 4.2, len(panels))
    for ax, (device, pts) in zip(np.atleast_1d(axes), panels.items()):
        roof = {p.kernel: p.rate for p in pts if p.kernel in ROOFS}
        kernels = [p for p in pts if p.kernel not in ROOFS]
        xs = [p.intensity for p in kernels] + [0.1, 1e3]
        span = np.logspace(np.log10(min(xs) / 2), np.log10(max(xs) * 2), 200)
        sheet = datasheet(device) or (None,) * 4
        for name, peak, ref, grey in ((ROOFS[0], roof.get(ROOFS[0]), sheet[0], "k"),
                                      (ROOFS[1], roof.get(ROOFS[1]), sheet[1], "0.55"))[:1 + fp64]:
            for what, top, bw, style in (("measured", peak, roof.get(ROOFS[2]), "-"), ("datasheet", ref, sheet[2], "--")):
                if top and bw:
                    ax.plot(span, np.minimum(top, span * bw) / 1e12, style, color=grey, lw=1.2,
                            label=f"{what} {name[6:10]} {top / 1e12:.3g} TFLOP/s, {bw / 1e12:.3g} TB/s")
        for p in kernels:
            ax.plot(p.intensity, p.rate / 1e12, "o", ms=7, label=f"{p.kernel} ({p.count})")
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte of device memory)",
               ylabel="attained TFLOP/s", title=device + (f", {kernels[0].date}" if kernels else ""))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(title)
    plot._note(fig, note)
    return fig


def show(live: list[Point] | None, notebook: str, title: str):
    """The figure a notebook shows: ``live`` points measured on the GPU here (roofs included) or,
    without them, the recorded GPU points of that notebook with a note."""
    if live:
        return figure({live[0].device: live}, title, fp64=notebook == "02")
    pts = read()
    devices = dict.fromkeys(p.device for p in pts if p.notebook == notebook)
    panels = {d: [p for p in pts if p.device == d and p.notebook in (notebook, "")] for d in devices}
    note = ("Recorded on the GPUs named above (hpclab/data/roofline.csv); on the simulator kernels run as "
            "Python threads, and their times say nothing about a GPU." if panels else
            f"No GPU run of notebook {notebook}'s kernels recorded yet (python -m hpclab.roofline on a GPU).")
    return figure(panels or {"NVIDIA H100 80GB HBM3": [], "NVIDIA H200": []}, title, note, fp64=notebook == "02")


def record(path: str) -> None:
    """The roofs and the notebooks' kernels measured here, as CSV (``python -m hpclab.roofline FILE``)."""
    from hpclab.matmul.bench import measure

    n = backend.auto_size(gpu=4096, sim=32)
    points = measure_roofs() + pi_points() + matmul_points(n, measure(n, repeats=5)) + conv_points()
    for pt in points:
        pt.command = "python -m hpclab.roofline FILE"
    with open(path, "w", newline="") as fh:
        write(points, fh)


if __name__ == "__main__":
    record(sys.argv[1])
