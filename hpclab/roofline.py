"""The roofline of the GPU in use, and where each kernel of a notebook sits under it.

A kernel doing F floating-point operations on B bytes of device memory in T seconds has arithmetic
intensity I = F / B and attains F / T, below min(P, I W) for peak rate P and bandwidth W. Both roofs are
measured beside the datasheet's: ``fma_kernel`` (CHAINS independent chains of fused multiply-adds per thread,
STEPS written out per pass so that loop instructions take few issue slots) and ``copy_kernel``. A kernel's
FLOPs and bytes are counted from its loops, assuming no cache (each topic's ``measure.roofline_points``);
``benchmarks/perf_record.py`` records them on a GPU into ``data/roofline.csv``, which the simulator shows.
"""
from __future__ import annotations

import csv
import datetime
import io
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from hpclab import backend
from hpclab.device import identity
from hpclab.results import plot  # the figure helpers

cuda = backend.cuda()       # module level: the simulator swaps this name inside kernels
CHAINS, STEPS = 8, 16
# (device name pattern, FP32 and FP64 (no tensor cores) FLOP/s, memory bytes/s, source)
DATASHEET = [
    (r"H100 80GB HBM3$", 67e12, 34e12, 3.35e12, "NVIDIA H100 datasheet, SXM (nvidia.com/en-us/data-center/h100)"),
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


def point(kernel: str, flops: float, nbytes: float, seconds: float, count: str, notebook: str = "") -> Point:
    """A point measured now on this GPU."""
    return Point(kernel, flops, nbytes, seconds, count, notebook, identity()[0], datetime.date.today().isoformat())


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
    passes, words = (1, 1 << 10) if backend.is_simulator() else (1024, 1 << 26)
    out, flops = [], 2.0 * CHAINS * STEPS * passes * blocks * threads
    for dtype, name in ((np.float32, ROOFS[0]), (np.float64, ROOFS[1])):
        res, k = cuda.device_array(blocks * threads, dtype), fma_kernel(np.dtype(dtype))
        t = median_time(lambda: k[blocks, threads](res, passes, dtype(0.999), dtype(0.001)), repeats)  # noqa: B023
        out.append(point(name, flops, 0.0, t, f"{CHAINS} chains x {STEPS * passes} steps a thread"))
    src = cuda.to_device(np.ones(words))
    dst = cuda.device_array_like(src)
    t = median_time(lambda: copy_kernel[blocks, threads](src, dst), repeats)
    return out + [point(ROOFS[2], 0.0, 2.0 * src.nbytes, t, f"{src.nbytes >> 20} MiB read + written")]


def gemm_count(m: int, n: int, k: int, tile_m: int, tile_n: int) -> tuple[float, float]:
    """FLOPs and bytes of a float32 C = A B in tile_m x tile_n tiles of C, no cache: a tile reads tile_m x k
    of A and k x tile_n of B, mnk (1/tile_m + 1/tile_n) floats in all, and C is written once (one output per
    thread: 1 x 1 tiles; a tile larger than C reads no more than all of it, e.g. 128 x 128 tiles at N = 64)."""
    tile_m, tile_n = min(tile_m, m), min(tile_n, n)
    return 2.0 * m * n * k, 4.0 * (m * n * k * (1 / tile_m + 1 / tile_n) + m * n)


# ---------------------------------------------------------------- recorded points, the figure

def read(text: str | None = None) -> list[Point]:
    """Points of a CSV of :class:`Point` fields (benchmarks/perf_record.py); by default ``data/roofline.csv``."""
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
            for what, top, bw, style in (("measured", peak, roof.get(ROOFS[2]), "-"),
                                         ("datasheet", ref, sheet[2], "--")):
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
            f"No GPU run of notebook {notebook}'s kernels recorded yet (benchmarks/perf_record.py on a GPU).")
    return figure(panels or {"NVIDIA H100 80GB HBM3": [], "NVIDIA H200": []}, title, note, fp64=notebook == "02")
