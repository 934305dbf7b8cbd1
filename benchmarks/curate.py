"""The curated GPU results (benchmarks/results/<machine>_<topic>.csv) -> what is generated from them.

    python benchmarks/curate.py build    # rewrite hpclab/data/recorded.csv and the README's result tables
    python benchmarks/curate.py check    # exit 1 if either is out of date, or a quoted figure disagrees

The tables are the source (benchmarks/record.py adds a run to them). From them:
- ``hpclab/data/recorded.csv``, package data that ``hpclab.results.recorded`` reads: one row per figure under a key
  ``program/variant/run/<gpus>gpu/<size>/metric`` (run = the machine, h200x4, or machine-name for a named
  run), and one more per compared figure whose value is the ratio to its baseline: metric ``vs_BASELINE``
  for a throughput (tflops, busbw, rate), ``METRIC_vs_BASELINE`` otherwise;
- the blocks of README.md's "Measured on real GPUs" between ``<!-- table: NAME -->`` and ``<!-- /table -->``.
A figure quoted in prose (README or notebook) carries its key in a comment right after it,
``0.923 ms<!-- recorded: allreduce/nccl/h200x2/2gpu/268435456/time_s -->``, and must equal the table's
value in the quoted unit, rounded to the digits quoted.
"""
from __future__ import annotations

import csv
import io
import re
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: the tables' columns and files)

ROOT = record.ROOT
RESULTS = record.RESULTS
RECORDED = ROOT / "hpclab" / "data" / "recorded.csv"
README = ROOT / "README.md"
KEYED = ["key", "topic", "program", "variant", "run", "date", "device", "gpus", "size", "size_unit", "metric", "value",
         "unit", "command", "note", "source"]
THROUGHPUT = {"tflops", "busbw", "rate"}
BLOCK = re.compile(r"(<!-- table: (\S+) -->\n)(.*?)(<!-- /table -->)", re.S)
MARKER = re.compile(r"<!--\s*recorded:\s*(\S+)\s*-->")
NUMBER = re.compile(r"(\d{1,3}(?:[,\u2009\u202f ]\d{3})+|\d+(?:\.\d+)?(?:e[-+]?\d+)?)")
SCALE = {"%": 100.0, "ms": 1e3, "µs": 1e6, "us": 1e6, "ns": 1e9, "M": 1e-6}   # quoted unit <- the table's


# ---------------------------------------------------------------- the tables and their keys

def tables() -> dict[str, list[dict]]:
    """Every curated table by file name (h200x4_pi.csv), rows as written."""
    return {p.name: record.load(p) for p in sorted(RESULTS.glob("*_*.csv"))}


def keyed_rows() -> list[dict]:
    """The rows of hpclab/data/recorded.csv, in table order, ratios after the figure they compare."""
    out = []
    for name, rows in tables().items():
        label, topic = name[:-4].split("_", 1)
        for r in rows:
            run = label + (f"-{r['run']}" if r["run"] else "")
            stem = "/".join(p for p in (r["program"], r["variant"], run, f"{r['gpus']}gpu", r["size"]) if p)
            base = {"topic": topic, "program": r["program"], "variant": r["variant"], "run": run, "date": r["date"],
                    "device": r["device"], "gpus": r["gpus"], "size": r["size"], "size_unit": r["size_unit"],
                    "command": r["command"], "note": r["note"], "source": f"benchmarks/results/{name}"}
            out.append({"key": f"{stem}/{r['metric']}", **base, "metric": r["metric"], "value": r["value"],
                        "unit": r["unit"]})
            if r["baseline"]:
                metric = ("" if r["metric"] in THROUGHPUT else f"{r['metric']}_") + f"vs_{r['baseline']}"
                out.append({"key": f"{stem}/{metric}", **base, "metric": metric, "value": r["ratio"], "unit": "1"})
    return out


def recorded_text(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=KEYED, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def table_problems() -> list[str]:
    """Rows that are not a complete, consistent figure, and tables named after another machine."""
    problems = []
    for name, rows in tables().items():
        keys, jobs = set(), {}
        for r in rows:                          # a run of a program is one job: its GPU count names the machine
            jobs[r["run"], r["program"]] = max(jobs.get((r["run"], r["program"]), 1), int(r["gpus"]))
        for i, r in enumerate(rows, 2):
            where = f"benchmarks/results/{name} line {i}"
            if not re.fullmatch(r"\d{4}-\d\d-\d\d", r["date"]) or not (r["device"] and r["command"] and r["unit"]):
                problems.append(f"{where}: date, device, command and unit are required")
            if record.machine(r["device"], jobs[r["run"], r["program"]]) != name.split("_")[0]:
                problems.append(f"{where}: {r['device']} on {jobs[r['run'], r['program']]} GPU(s) "
                                f"does not belong in {name}")
            if r["baseline"] and abs(float(r["value"]) / float(r["baseline_value"]) - float(r["ratio"])) \
                    > 1e-5 * abs(float(r["ratio"])):
                problems.append(f"{where}: ratio {r['ratio']} is not value / baseline_value")
            key = (r["run"], r["program"], r["variant"], r["gpus"], r["size"], r["metric"])
            if key in keys:
                problems.append(f"{where}: a second row for {key}")
            keys.add(key)
    return problems


# ---------------------------------------------------------------- formatting

def fixed(x: float, decimals: int) -> str:
    """x with this many decimals, halves rounded up (2.065 -> 2.07, as a reader rounds)."""
    return f"{Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-decimals), ROUND_HALF_UP):f}"


def sig(x: float, digits: int = 3) -> str:
    """x to this many significant digits: 20.0, 612, 1.205"""
    x = float(Decimal(repr(float(x))).quantize(Decimal(1).scaleb(Decimal(repr(float(x))).adjusted() - digits + 1),
                                               ROUND_HALF_UP)) if x else 0.0
    return fixed(x, max(0, digits - 1 - Decimal(repr(x)).adjusted())) if x else "0"


def sci(x: float, decimals: int = 2) -> str:
    """8.20e11, 5.6e-6"""
    exponent = Decimal(repr(float(sig(x, decimals + 1)))).adjusted()
    return f"{fixed(float(x) / 10 ** exponent, decimals)}e{exponent}"


def tf(x: float) -> str:
    """50.3, 7.75, 155.7 (TFLOP/s)"""
    return fixed(x, 1 if x >= 10 else 2)


def seconds(x: float) -> str:
    """612 µs, 1.205 ms, 307.3 ms, 1.20 s"""
    if x < 1e-3:
        return f"{sig(x * 1e6, 3)} µs"
    return f"{sig(x * 1e3, 4)} ms" if x < 1 else f"{sig(x, 3)} s"


def count(x: float) -> str:
    """83 713"""
    return f"{int(Decimal(repr(float(x))).quantize(Decimal(1), ROUND_HALF_UP)):,}".replace(",", " ")


def nbytes(n: int) -> str:
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {suffix}"
    return f"{n} B"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


class Figures:
    """Lookups for the README blocks: values and rows by key (the keys of recorded.csv)."""

    def __init__(self, rows: list[dict]):
        self.by_key = {r["key"]: r for r in rows}

    def row(self, key: str) -> dict:
        if key not in self.by_key:
            raise KeyError(f"the README's tables need {key}, which no curated table has")
        return self.by_key[key]

    def __call__(self, key: str) -> float:
        return float(self.row(key)["value"])

    def has(self, key: str) -> bool:
        return key in self.by_key

    def caption(self, key: str, where: str) -> str:
        """'One H200, 2026-11-22: `command`' for the run of ``key``."""
        r = self.row(key)
        command, _, more = r["command"].partition("   (")        # '... (N = 1, 2, 4)': one job per rank count
        return f"{where}, {r['date']}: `{command}`" + (f" ({more}" if more else "") + "\n\n"


# ---------------------------------------------------------------- the README's blocks

def matmul(f: Figures) -> str:
    k = "matmul/{}/{}/1gpu/{}/{}"
    h200, h100 = (f.row(k.format("warp", run, 4096, "tflops")) for run in ("h200", "h100"))
    out = (f"One H200 ({h200['date']}) and one H100 80GB HBM3 ({h100['date']}), one run each: "
           f"`{h200['command']}`" + ("" if h100["command"] == h200["command"] else f", `{h100['command']}`") + "\n\n") + \
        ("| GPU | N | cuBLAS | warp-tiled (128×128×16, warps 32×64, 8×8 per lane) | fast (128×128×8, 8×8 per thread) "
         "| tiled (32×32) | naive |\n|---|---|---|---|---|---|---|\n")
    for run, gpu in (("h200", "H200"), ("h100", "H100")):
        for n in (4096, 8192):
            cells = [f"{tf(f(k.format('cublas', run, n, 'tflops')))} TFLOP/s"]
            for kernel in ("warp", "fast", "tiled", "naive"):
                if not f.has(k.format(kernel, run, n, "tflops")):
                    cells.append("—")
                    continue
                value, ratio = tf(f(k.format(kernel, run, n, "tflops"))), 100 * f(k.format(kernel, run, n, "vs_cublas"))
                cells.append(f"{value} TFLOP/s = **{fixed(ratio, 1)} % of cuBLAS**" if kernel == "warp"
                             else f"{value} ({fixed(ratio, 1)} %)")
            out += f"| {gpu} | {n} | " + " | ".join(cells) + " |\n"
    return out


def pi(f: Figures) -> str:
    from hpclab.results import recorded

    a100 = recorded.a100("pi-mc").points[0]
    mc = {v: f(f"pi-mc/{v}/h200/1gpu/rate") for v in ("bench", "bench-philox10", "bench-splitmix64",
                                                       "bench-xoroshiro128p")}
    vs = {v: fixed(f(f"pi-mc/{v}/h200/1gpu/vs_bench-xoroshiro128p"), 2) for v in ("bench", "bench-philox10",
                                                                                   "bench-splitmix64")}
    mid, plain = f("pi-midpoint/bench/h200/1gpu/rate"), f("pi-midpoint/bench-plain/h200/1gpu/rate")
    init = next(r for r in f.by_key.values() if r["key"].startswith("pi-mc/bench-xoroshiro128p/h200/1gpu/")
                and r["metric"] == "init_s")
    rows = [("Monte Carlo, counter-based Philox4x32-7, samples/s per GPU", f"**{sci(mc['bench'])}**",
             f"{vs['bench']}× xoroshiro128+ (`numba.cuda.random`, {sci(mc['bench-xoroshiro128p'])})",
             f"≥ 8e11: {met(mc['bench'] >= 8e11)} ({fixed(mc['bench'] / 8e11, 2)}×)",
             sci(a100["rate"])),
            ("Monte Carlo, Philox4x32-10 / SplitMix64", f"{sci(mc['bench-philox10'])} / {sci(mc['bench-splitmix64'])}",
             f"{vs['bench-philox10']}× / {vs['bench-splitmix64']}× xoroshiro128+", "", ""),
            (f"xoroshiro128+ state initialisation, {count(float(init['size']))} states",
             f"{fixed(init['value'], 3)} s (host side)", "", "", ""),
            ("midpoint rule, float64, bins/s per GPU", f"**{sci(mid)}**",
             f"{fixed(f('pi-midpoint/bench/h200/1gpu/vs_bench-plain'), 2)}× one division per bin ({sci(plain)})",
             f"≥ 1e12: {met(mid >= 1e12)} ({fixed(mid / 1e12, 2)}×)", "")]
    return (f.caption("pi-mc/bench/h200/1gpu/rate", "One H200")
            + "| measure | H200 | comparison in the same run | target | workshop A100 |\n|---|---|---|---|---|\n"
            + "".join("| " + " | ".join(row) + " |\n" for row in rows))


def pi_scaling(f: Figures) -> str:
    from hpclab.results import recorded

    out = "| run | samples | 1 GPU | 2 GPUs | 4 GPUs | efficiency at the most GPUs |\n|---|---|---|---|---|---|\n"
    for run, what in (("h200x4", "4× H200"), ("h200x2", "2× H200")):
        walls = sorted((r for r in f.by_key.values() if r["program"] == "pi-mc" and r["run"] == run
                        and r["variant"] == "strong" and r["metric"] == "wall_s"), key=lambda r: int(r["gpus"]))
        top = walls[-1]
        stem = top["key"].rsplit("/", 1)[0]
        eff = f(stem + "/efficiency")
        note = top["note"].split(";")[0].split(",")[0]
        cells = {int(r["gpus"]): f"{fixed(r['value'], 3)} s" for r in walls}
        serial = fixed(f(stem + "/serial_fraction"), 4)
        extra = f" (Amdahl serial fraction {serial}; target ≥ 0.98 at 4: {met(eff >= 0.98)})" \
            if int(top["gpus"]) == 4 else ""
        out += (f"| {what}, {top['date']}, {note} | {sci(float(top['size']))} | "
                + " | ".join(cells.get(n, "—") for n in (1, 2, 4)) + f" | **{fixed(eff, 4)}**{extra} |\n")
    a100 = recorded.a100("pi-mc")
    out += (f"| workshop A100 (FASRC) | {sci(a100.points[0]['work'])} | "
            + " | ".join(f"{fixed(p['seconds'], 1)} s" for p in a100.points)
            + f" | {fixed(a100.efficiencies()[-1][1], 4)} |\n")
    return out


def allreduce(run: str, ranks: int):
    def render(f: Figures) -> str:
        k = f"allreduce/{{}}/{run}/{ranks}gpu/{{}}/{{}}"
        out = f.caption(k.format("nccl", 1 << 28, "busbw"), f"{ranks}× H200")
        out += "| size | host-staged MPI | hpclab `nccl` | raw NCCL | hpclab / raw |\n|---|---|---|---|---|\n"
        for size in (64, 4096, 1 << 20, 1 << 28, 1 << 30):
            cells = []
            for backend in ("mpi-host", "nccl", "raw-nccl"):
                t, bw = f(k.format(backend, size, "time_s")), f(k.format(backend, size, "busbw"))
                cells.append(seconds(t) + (f" ({fixed(bw, 1)} GB/s)" if size >= 1 << 20 else ""))
            if size <= 1 << 16:
                ratio = f(k.format("nccl", size, "time_s_vs_raw-nccl"))
                note = f"time {fixed(ratio, 2)}×" + (f" (target ≤ 1.5×: {met(ratio <= 1.5)})" if size == 64 else "")
            else:
                ratio = f(k.format("nccl", size, "vs_raw-nccl"))
                note = (f"**{fixed(ratio, 4)}** (target ≥ 0.95: {met(ratio >= 0.95)})" if size == 1 << 28
                        else f"busbw {fixed(ratio, 3)}")
            out += f"| {nbytes(size)} | " + " | ".join(cells) + f" | {note} |\n"
        return out
    return render


def ddp_scaling(f: Figures) -> str:
    k = "ddp-scaling/{}/h200x4/{}gpu/{}/{}"
    out = f.caption(k.format("weak", 4, 4096, "step_s"), "4× H200")
    out += ("| GPUs | weak: batch 1024 per GPU, ms per step | samples/s | efficiency | strong: global batch 2048, ms "
            "| samples/s | efficiency |\n|---|---|---|---|---|---|---|\n")
    for n in (1, 2, 4):
        cells = []
        for mode, batch in (("weak", 1024 * n), ("strong", 2048)):
            eff = f(k.format(mode, n, batch, "efficiency"))
            cells += [fixed(1e3 * f(k.format(mode, n, batch, "step_s")), 2),
                      count(f(k.format(mode, n, batch, "samples_per_s"))),
                      f"**{fixed(eff, 2)}**" if n == 4 and mode == "weak" else fixed(eff, 2)]
        out += f"| {n} | " + " | ".join(cells) + " |\n"
    return out


def ddp_overlap(f: Figures) -> str:
    k = "ddp-scaling/{}/h200x2/{}gpu/{}/{}"
    out = f.caption(k.format("weak-overlap", 2, 2048, "step_s"), "2× H200")
    out += ("| sweep | GPUs | after the backward pass: ms per step | efficiency | overlapped: ms per step "
            "| efficiency | all-reduce hidden |\n|---|---|---|---|---|---|---|\n")
    for mode, batch in (("weak", 1024), ("strong", 2048)):
        for n in (1, 2):
            b = batch * n if mode == "weak" else batch
            after, over = k.format(mode, n, b, "{}"), k.format(f"{mode}-overlap", n, b, "{}")
            out += (f"| {mode} | {n} | {fixed(1e3 * f(after.format('step_s')), 2)} | {fixed(f(after.format('efficiency')), 2)} "
                    f"| {fixed(1e3 * f(over.format('step_s')), 2)} | {fixed(f(over.format('efficiency')), 2)} "
                    f"| {fixed(100 * f(over.format('hidden_share')), 1)} % |\n")
    return out


def ddp_buckets(f: Figures) -> str:
    k = "ddp-scaling/{}/h200x2/2gpu/2048/{}"
    out = f.caption(k.format("buckets-16", "step_s"), "2× H200, batch 1024 per GPU")
    out += ("| buckets | ms per step | forward + backward, ms | all-reduce left after the backward pass, ms "
            "| all-reduce time, ms | hidden |\n|---|---|---|---|---|---|\n")
    out += (f"| one, after the backward pass | {fixed(1e3 * f(k.format('buckets', 'step_s')), 2)} "
            f"| {fixed(1e3 * f(k.format('buckets', 'compute_s')), 2)} "
            f"| {fixed(1e3 * f(k.format('buckets', 'comm_share')) * f(k.format('buckets', 'step_s')), 2)} | — | — |\n")
    for mb in (1, 4, 16, 64, 256):
        v = f"buckets-{mb}"
        out += (f"| {count(f(k.format(v, 'buckets')))} of ≥ {mb} MiB | {fixed(1e3 * f(k.format(v, 'step_s')), 2)} "
                f"| {fixed(1e3 * f(k.format(v, 'compute_s')), 2)} "
                f"| {fixed(1e3 * f(k.format(v, 'comm_s')), 2)} | {fixed(1e3 * f(k.format(v, 'allreduce_s')), 2)} "
                f"| {fixed(100 * f(k.format(v, 'hidden_share')), 1)} % |\n")
    return out


CONV_METHODS = {"winograd": 'ours, Winograd F(3×3, 5×5) (`method="winograd"`)',
                "winograd-f4": "ours, Winograd F(4×4, 5×5)",
                "winograd-f2": "ours, Winograd F(2×2, 5×5) (the default before F(3×3))",
                "gemm": "ours, im2col + register-blocked GEMM (`gemm`, the halo versions' default)",
                "direct": "ours, direct tiled kernel (`direct`, its best tile shape)",
                "cudnn-fp32": "cuDNN FP32, TF32 off (PyTorch `conv2d`, `cudnn.benchmark`)",
                "cudnn-tf32": "cuDNN TF32",
                "torch-sgemm-fp32": "PyTorch unfold + cuBLAS SGEMM, FP32"}


def conv_throughput(f: Figures) -> str:
    k = "conv-c2/{}/h200/1gpu/32/{}"
    out = f.caption(k.format("winograd", "tflops"), "One H200") \
        + f"({f.row(k.format('winograd', 'tflops'))['note']})\n\n"
    out += ("| method | TFLOP/s back to back | per call | error vs float64 | / cuDNN FP32 (back to back, per call) |\n"
            "|---|---|---|---|---|\n")
    for method, label in CONV_METHODS.items():
        ratio = "—" if method == "cudnn-fp32" else (f"{fixed(f(k.format(method, 'vs_cudnn-fp32')), 3)}, "
                                                    f"{fixed(f(k.format(method, 'latency_tflops_vs_cudnn-fp32')), 3)}")
        value = tf(f(k.format(method, "tflops")))
        out += (f"| {label} | {'**' + value + '**' if method == 'winograd' else value} | "
                f"{tf(f(k.format(method, 'latency_tflops')))} | {sci(f(k.format(method, 'error')), 1)} | {ratio} |\n")
    return out


def conv_runs(f: Figures) -> str:
    out = ("| run | Winograd | TFLOP/s | cuDNN FP32 | Winograd / cuDNN FP32, back to back | per call |\n"
           "|---|---|---|---|---|---|\n")
    for run, what, tile in (("h200", "one H200, the record above", 3), ("h100", "one H100 80GB HBM3", 3),
                            ("h200-plan-fix", "one H200, in the 4-GPU scaling run", 2),
                            ("h200-first-winograd", "one H200, the first Winograd run", 2)):
        k = f"conv-c2/{{}}/{run}/1gpu/32/{{}}"
        out += (f"| {what} | F({tile}×{tile}, 5×5) | {tf(f(k.format('winograd', 'tflops')))} | {tf(f(k.format('cudnn-fp32', 'tflops')))} | "
                f"{fixed(f(k.format('winograd', 'vs_cudnn-fp32')), 3)} | "
                f"{fixed(f(k.format('winograd', 'latency_tflops_vs_cudnn-fp32')), 3)} |\n")
    return out


def conv_scaling(f: Figures) -> str:
    k = "conv-halo/{}-{}/h200x4/{}gpu/{}/{}"
    out = f.caption(k.format("strong", "nccl", 4, 32768, "wall_s"), "4× H200")
    out += "| | 1 GPU | 2 GPUs | 4 GPUs | target |\n|---|---|---|---|---|\n"
    for mode, rows, what, target in (("strong", lambda n: 32768, "strong, 32 768 rows", 0.90),
                                     ("weak", lambda n: 8192 * n, "weak, 8192 rows per GPU", 0.95)):
        cells = [f"{fixed(f(k.format(mode, 'mpi-host', 1, rows(1), 'wall_s')), 4)} s"]
        for n in (2, 4):
            walls = " / ".join(fixed(f(k.format(mode, c, n, rows(n), "wall_s")), 4) for c in ("mpi-host", "nccl"))
            effs = " / ".join(fixed(f(k.format(mode, c, n, rows(n), "efficiency")), 3) for c in ("mpi-host", "nccl"))
            cells.append(f"{walls} s: " + (f"**{effs}**" if n == 4 else effs))
        ok = all(f(k.format(mode, c, 4, rows(4), "efficiency")) >= target for c in ("mpi-host", "nccl"))
        out += (f"| {what}, host-staged / NCCL halos | " + " | ".join(cells)
                + f" | ≥ {fixed(target, 2)} at 4: {met(ok)} |\n")
    return out


BLOCKS = {"matmul": matmul, "pi": pi, "pi-scaling": pi_scaling, "allreduce-h200x4": allreduce("h200x4", 4),
          "allreduce-h200x2": allreduce("h200x2", 2), "ddp-scaling": ddp_scaling, "ddp-overlap": ddp_overlap,
          "ddp-buckets": ddp_buckets, "conv-throughput": conv_throughput,
          "conv-runs": conv_runs, "conv-scaling": conv_scaling}


def readme_text(text: str, figures: Figures) -> str:
    """README.md with every block regenerated; a block name without a renderer is an error."""
    def fill(m):
        if m.group(2) not in BLOCKS:
            raise KeyError(f"README.md: no table named {m.group(2)!r}; known: {', '.join(BLOCKS)}")
        return m.group(1) + BLOCKS[m.group(2)](figures) + m.group(4)
    return BLOCK.sub(fill, text)


# ---------------------------------------------------------------- quoted figures

def quote_problem(text_before: str, key: str, row: dict) -> str | None:
    """None when the number just before a marker equals the row's value as quoted, else why not."""
    tail = re.sub(r"[*_`]+$", "", text_before.rstrip()).rstrip()
    match = re.search(NUMBER.pattern + r"\s*([^\s\d(]*)$", tail)
    if not match:
        return f"no number before the marker for {key}"
    number, unit = match.group(1), match.group(2)
    digits = re.sub(r"[,\u2009\u202f ]", "", number)
    if unit in ("", row["unit"]) or unit == row["unit"].split("/")[0]:
        scale = 1.0
    elif unit in SCALE:
        scale = SCALE[unit]
    else:
        return f"{number} {unit}: unit {unit!r} cannot be compared with the table's {row['unit']!r} ({key})"
    mantissa, _, exponent = digits.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    half_step = 0.5 * 10.0 ** (-decimals) * (10.0 ** int(exponent) if exponent else 1.0)
    actual = float(row["value"]) * scale
    if abs(float(digits) - actual) > half_step * (1 + 1e-9):
        return (f"quotes {number}{(' ' + unit) if unit else ''} but {key} is {float(row['value']):.6g} {row['unit']} "
                f"(= {actual:.6g} {unit or row['unit']}; source {row['source']})")
    return None


def quotes(text: str):
    """(text before the marker, key) for every marker in a text."""
    for m in MARKER.finditer(text):
        yield text[:m.start()], m.group(1)


def measured_section(text: str) -> str:
    start = text.index("## Measured on real GPUs")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def quote_problems(text: str, rows_by_key: dict, where: str) -> list[str]:
    problems = []
    for before, key in quotes(text):
        row = rows_by_key.get(key)
        why = quote_problem(before, key, row) if row else f"no recorded figure {key}"
        if why:
            problems.append(f"{where}: {why}")
    return problems


# A measured figure in prose: a decimal (0.87, 5.5e-16) or a number with a unit of time, rate, bandwidth or
# share, or a ratio (1.16×; not 5×5 nor 4× H200); not a version (4.1.6) nor a target (≥ 0.95).
PROSE_NUMBER = re.compile(r"(?<![\w.])(?<![≥≤] )(\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.]*\.\d)(?!\w)")
UNIT = re.compile(r"\s*(?:%|×(?!\s*[\dA-Z])|µs|us|ms|ns|s\b|TFLOP/s|GB/s|samples/s|bins/s)")


def unmarked_figures(section: str) -> list[str]:
    """Measured figures in a text's prose that are neither in a generated table nor quoted with a marker."""
    text = BLOCK.sub("", section)
    text = re.sub(r"`[^`]*`", "", text)                       # commands and names
    for m in reversed(list(MARKER.finditer(text))):
        tail = re.sub(r"[*_`]+$", "", text[:m.start()].rstrip()).rstrip()
        quoted = re.search(NUMBER.pattern + r"\s*([^\s\d(]*)$", tail)
        start = quoted.start() if quoted else m.start()
        text = text[:start] + text[m.end():]
    found = []
    for m in PROSE_NUMBER.finditer(text):
        unit = UNIT.match(text, m.end())
        if unit or re.search(r"[.e]", m.group(1)):
            found.append(m.group(1) + (unit.group(0) if unit else ""))
    return found


def lookup() -> dict:
    """Keyed rows of the curated tables and the workshop's A100 runs, as quotes see them."""
    from hpclab.results import recorded

    return {r["key"]: r for r in keyed_rows()} | {r["key"]: r for r in recorded.a100_rows()}


# ---------------------------------------------------------------- build / check

def build() -> list[str]:
    rows = keyed_rows()
    written = []
    if not RECORDED.exists() or RECORDED.read_text() != recorded_text(rows):
        RECORDED.write_text(recorded_text(rows))
        written.append(str(RECORDED.relative_to(ROOT)))
    text = README.read_text()
    new = readme_text(text, Figures(rows))
    if new != text:
        README.write_text(new)
        written.append("README.md")
    return written


def check() -> list[str]:
    rows = keyed_rows()
    problems = table_problems()
    if not RECORDED.exists() or RECORDED.read_text() != recorded_text(rows):
        problems.append("hpclab/data/recorded.csv is out of date with benchmarks/results/")
    text = README.read_text()
    if readme_text(text, Figures(rows)) != text:
        problems.append("README.md's result tables are out of date with benchmarks/results/")
    section = measured_section(text)
    problems += quote_problems(section, lookup(), "README.md")
    problems += [f"README.md: {x!r} in 'Measured on real GPUs' is neither in a generated table nor quoted with its key"
                 for x in unmarked_figures(section)]
    return problems


def main(argv: list[str]) -> int:
    if argv not in (["build"], ["check"]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv == ["build"]:
        for name in build():
            print(f"wrote {name}")
    problems = check()
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        print("run `python benchmarks/curate.py build` (generated from benchmarks/results/); a quoted figure that "
              "disagrees is fixed by hand", file=sys.stderr)
        return 1
    print(f"hpclab/data/recorded.csv and README.md match benchmarks/results/ ({len(tables())} tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
