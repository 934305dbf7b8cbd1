"""Turn benchmark results into rows of the curated tables, benchmarks/results/<machine>_<topic>.csv.

    python benchmarks/record.py build/bench         # what `make bench` wrote ($OUT/runs.jsonl names each
                                                    # result file's command, date and device)
    python benchmarks/record.py FILE --command "python3 -m hpclab bench pi --json" [--date 2026-11-22]
                                     [--device "NVIDIA H200"] [--run NAME] [--note TEXT] [--into DIR]

A result file is what a benchmark writes: the JSON line of `hpclab bench matmul|pi|allreduce|conv
throughput|ddp --mode digits`, the CSV of `hpclab scaling`, `hpclab bench conv summarize` or `hpclab
bench ddp --mode scaling`, or the suite's ddp_mlp_equivalence.json. Each becomes one row per figure:
date, run, device, GPUs, program, variant, problem size, metric, value and unit, and the comparison
measured in the same run (baseline, its value and value / baseline) where the benchmark has one,
with the exact command. The machine is the GPU's short name and the job's GPU count (h200, h200x4).

A new record replaces the rows of the same program, variant and run in its table (git keeps the old
ones); --run NAME keeps it beside the record as a named run (a repeat, an experiment). Afterwards
`python benchmarks/curate.py build` regenerates hpclab/data/recorded.csv and the README's tables.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hpclab.programs import PROGRAMS  # what each program's table and work unit are

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FIELDS = ["date", "run", "device", "gpus", "program", "variant", "size", "size_unit", "metric", "value", "unit",
          "baseline", "baseline_value", "ratio", "command", "note"]


class RecordError(ValueError):
    pass


@dataclass
class Found:
    """What one result file measured: its table's topic, the job's GPU count, rows, and what it says of itself."""

    topic: str
    gpus: int
    rows: list[dict]
    date: str = ""
    device: str = ""
    command: str = ""
    note: str = ""
    meta: dict = field(default_factory=dict)


def fig(program, variant, gpus, size, size_unit, metric, value, unit, baseline="", base=None) -> dict:
    """One figure; with ``baseline`` and its value ``base`` (same unit, same run), the ratio value / base."""
    row = {"program": program, "variant": variant, "gpus": gpus, "size": size, "size_unit": size_unit,
           "metric": metric, "value": value, "unit": unit, "baseline": "", "baseline_value": "", "ratio": ""}
    if baseline and base:
        row.update(baseline=baseline, baseline_value=base, ratio=float(value) / float(base))
    return row


def number(x, whole: bool = False) -> str:
    """Counts (and sizes: ``whole``) as integers, other values to 7 significant digits (far below the noise)."""
    if x in ("", None):
        return ""
    x = float(x)
    return str(int(x)) if x.is_integer() and (whole or abs(x) < 1e9) else f"{x:.7g}"


def machine(device: str, gpus: int) -> str:
    """'NVIDIA H200', 4 -> 'h200x4'; 'NVIDIA H100 80GB HBM3', 1 -> 'h100'."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", device)
    name = m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "gpu"
    return name + (f"x{gpus}" if gpus > 1 else "")


def slug(text: str) -> str:
    """'128x128x16 / 8x8 vec4 pad4' -> '128x128x16-8x8-vec4-pad4' (a key part: no slashes, no spaces)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


# ---------------------------------------------------------------- one converter per kind of result file

def matmul_bench(d: dict) -> Found:
    """`hpclab bench matmul --json`: every kernel and tile shape against cuBLAS, and their resources."""
    rows = []
    resources = {"regs_per_thread": "registers", "shared_bytes_per_block": "B", "local_bytes_per_thread": "B",
                 "blocks_per_sm": "blocks", "warps_per_sm": "warps", "occupancy": "1"}
    for size, block in d["sizes"].items():
        cublas = next((r["tflops"] for r in block["rows"] if r["kernel"] == "cublas"), None)
        for r in block["rows"]:
            variant = r["kernel"]
            default = d.get(f"default_{variant}_config")
            if default and r["config"] != default:
                variant = f"{variant}-{slug(r['config'])}"             # the tile-shape sweeps
            base = r.get("cublas_tflops", cublas) if r["kernel"] != "cublas" else None   # timed in turns with it
            rows.append(fig("matmul", variant, 1, int(size), "N", "tflops", r["tflops"], "TFLOP/s", "cublas", base))
            rows += [fig("matmul", variant, 1, int(size), "N", k, r[k], unit)
                     for k, unit in resources.items() if k in r]
            rows += [fig("matmul", variant, 1, int(size), "N", f"sass_{op}", n, "instructions")
                     for op, n in r.get("sass", {}).items()]
    command = re.sub(r"\s--out\s+\S+", "", d.get("command", ""))
    if command.startswith("hpclab "):
        command = "python3 -m " + command
    return Found("matmul", 1, rows, d.get("date", ""), d["device"]["name"], command)


def pi_bench(d: dict) -> Found:
    """`hpclab bench pi --json`: the counter-based generator against numba.cuda.random's xoroshiro128+,
    the 4-bins-per-division midpoint kernel against one division per bin (the launch-shape scan is not kept)."""
    mc, mid = d["mc_counter_samples_per_s"], d["midpoint_bins_per_s"]
    xoro = d["mc_xoroshiro_samples_per_s"]
    rows = [fig("pi-mc", "bench", 1, "", "", "rate", mc, "samples/s", "bench-xoroshiro128p", xoro)]
    for key, variant in (("mc_philox10_samples_per_s", "bench-philox10"),
                         ("mc_splitmix_samples_per_s", "bench-splitmix64")):
        if key in d:
            rows.append(fig("pi-mc", variant, 1, "", "", "rate", d[key], "samples/s", "bench-xoroshiro128p", xoro))
    plain = d["midpoint_plain_bins_per_s"]
    rows += [fig("pi-mc", "bench-xoroshiro128p", 1, "", "", "rate", xoro, "samples/s"),
             fig("pi-mc", "bench-xoroshiro128p", 1, d["xoroshiro_states"], "states", "init_s", d["xoroshiro_init_s"],
                 "s"),
             fig("pi-midpoint", "bench", 1, "", "", "rate", mid, "bins/s", "bench-plain", plain),
             fig("pi-midpoint", "bench-plain", 1, "", "", "rate", plain, "bins/s")]
    note = f"counter-based generator {d['mc_counter_generator']}" if d.get("mc_counter_generator") else ""
    return Found("pi", 1, rows, d.get("date", ""), d.get("device", ""), d.get("command", ""), note)


def allreduce(d: dict) -> Found:
    """`hpclab bench allreduce --json`: time and bus bandwidth per backend and size, raw NCCL the baseline."""
    raw = {r["size_bytes"]: r for r in d["rows"] if r["backend"] == "raw-nccl"}
    rows = []
    for r in d["rows"]:
        if r["size_bytes"] < 64:        # the first size of a run includes NCCL's set-up: not a latency
            continue
        b = raw.get(r["size_bytes"]) if r["backend"] != "raw-nccl" else None
        rows.append(fig("allreduce", r["backend"], d["ranks"], r["size_bytes"], "bytes", "time_s", r["time_us"] * 1e-6,
                        "s", "raw-nccl", b and b["time_us"] * 1e-6))
        rows.append(fig("allreduce", r["backend"], d["ranks"], r["size_bytes"], "bytes", "busbw", r["busbw_GBps"],
                        "GB/s", "raw-nccl", b and b["busbw_GBps"]))
    return Found("allreduce", d["ranks"], rows, d.get("date", ""), d.get("gpu", ""), d.get("command", ""),
                 "; ".join(d.get("notes", [])))


def conv_throughput(d: dict) -> Found:
    """`hpclab bench conv throughput`: our methods (the direct kernel's best tile shape) against cuDNN FP32."""
    program, batch = f"conv-{d['layer'].lower()}", d["shape"][0]
    methods = {"direct": d["ours"][d["best_direct"]],
               **{k: v for k, v in d["ours"].items() if not k.startswith("direct")}}
    theirs = {"cudnn_fp32": "cudnn-fp32", "cudnn_tf32": "cudnn-tf32", "torch_im2col_sgemm_fp32": "torch-sgemm-fp32"}
    methods.update({name: d[k] for k, name in theirs.items() if k in d})
    base = d.get("cudnn_fp32", {})
    rows = [fig(program, "fp32-peak", 1, batch, "images", "tflops", d["fp32_peak_tflops"], "TFLOP/s")] \
        if "fp32_peak_tflops" in d else []
    for variant, m in methods.items():
        other = variant != "cudnn-fp32"
        rows.append(fig(program, variant, 1, batch, "images", "tflops", m["tflops"], "TFLOP/s",
                        "cudnn-fp32", other and base.get("tflops")))
        if "latency_tflops" in m:
            rows.append(fig(program, variant, 1, batch, "images", "latency_tflops", m["latency_tflops"], "TFLOP/s",
                            "cudnn-fp32", other and base.get("latency_tflops")))
        if "max_rel_error_vs_float64" in m:
            rows.append(fig(program, variant, 1, batch, "images", "error", m["max_rel_error_vs_float64"], "1"))
    note = f"PyTorch {d['torch']}, cuDNN {d['cudnn']}" if "torch" in d else ""
    return Found("conv", 1, rows, d.get("date", ""), d.get("device", ""), d.get("command", ""), note)


def conv_scaling(table: list[dict]) -> Found:
    """`hpclab bench conv summarize --csv`: halo-exchange scaling; the 1-GPU run (no halo) is the base of
    both the host-staged and the NCCL curves."""
    rows = []
    for r in table:
        for comm in (["mpi-host", "nccl"] if r["ranks"] == "1" else [r["comm"]]):
            for metric in ("wall_s", "compute_s", "halo_s", "efficiency"):
                rows.append(fig("conv-halo", f"{r['mode']}-{comm}", int(r["ranks"]), int(r["height"]), "rows", metric,
                                r[metric], "1" if metric == "efficiency" else "s"))
    return Found("conv", max(int(r["ranks"]) for r in table), rows)


def ddp_scaling(table: list[dict]) -> Found:
    """`hpclab bench ddp --mode scaling|buckets --csv`: step time of the 3 x 4096 MLP; efficiency against
    1 GPU; with the all-reduce overlapped (variant ...-overlap, or buckets-<MiB>), how much of it was hidden."""
    def variant(r):
        if r.get("overlap") != "True":
            return r["sweep"]
        return f"buckets-{number(float(r['bucket_mb']))}" if r["sweep"] == "buckets" else f"{r['sweep']}-overlap"

    base = {variant(r): float(r["step_s"]) for r in table if r["gpus"] == "1"}
    rows = []
    for r in table:
        n, step, v = int(r["gpus"]), float(r["step_s"]), variant(r)
        eff = base[v] / step / (n if r["sweep"] == "strong" else 1) if v in base else None
        figures = [("step_s", step, "s"), ("samples_per_s", r["samples_per_s"], "samples/s"),
                   ("comm_share", r["comm_share"], "1"), ("efficiency", eff, "1"), ("parameters", r["parameters"], "1")]
        if r.get("overlap") in ("True", "False"):        # the CSV has the split (since overlap was added)
            figures += [("compute_s", r["compute_s"], "s"), ("update_s", r["update_s"], "s")]
        if r.get("overlap") == "True":
            figures += [("comm_s", r["comm_s"], "s"), ("allreduce_s", r["allreduce_s"], "s"),
                        ("hidden_share", r["hidden_share"], "1"), ("buckets", r["buckets"], "1")]
        for metric, value, unit in figures:
            if value is not None:
                rows.append(fig("ddp-scaling", v, n, int(r["global_batch"]), "samples", metric, value, unit))
    return Found("ddp", max(int(r["gpus"]) for r in table), rows, device=table[0].get("device", ""))


def ddp_digits(d: dict) -> Found:
    """`hpclab bench ddp --mode digits --json-out`: the digits MLP on one GPU, float32 and mixed precision."""
    rows = []
    for precision, r in d["results"].items():
        rows += [fig("ddp-digits", precision, 1, "", "", "test_accuracy", r["test_accuracy"], "1"),
                 fig("ddp-digits", precision, 1, "", "", "train_s", r["train_seconds"], "s"),
                 fig("ddp-digits", precision, 1, "", "", "time_to_threshold_s", r["time_to_threshold_s"], "s")]
        if r.get("loss_scale"):
            rows.append(fig("ddp-digits", precision, 1, "", "", "loss_scale", r["loss_scale"], "1"))
    return Found("ddp", 1, rows, d.get("date", ""), d.get("device", ""), d.get("command", ""))


def ddp_equivalence(d: dict) -> Found:
    """The suite's ddp_mlp_equivalence.json: per-step losses of ddp-mlp on 1 and on 2 GPUs."""
    return Found("ddp", 2, [fig("ddp-mlp", "1-vs-2-gpus", 2, "", "", "max_rel_diff", d["max_rel_diff"], "1")],
                 d.get("date", ""), d.get("device", ""), d.get("command", ""))


def scaling(table: list[dict]) -> Found:
    """`hpclab scaling PROGRAM --out DIR` (DIR/PROGRAM_MODE.csv): medians over trials per rank count."""
    program = table[0]["program"]
    per_ranks = {int(r["ranks"]): r for r in table}              # trials of one rank count share the medians
    rows = []
    for n, r in sorted(per_ranks.items()):
        for metric, unit in (("median_wall_s", "s"), ("speedup", "1"), ("efficiency", "1")):
            rows.append(fig(program, r["mode"], n, int(r["work"]), PROGRAMS[program].unit,
                            "wall_s" if metric == "median_wall_s" else metric, r[metric], unit))
    top = per_ranks[max(per_ranks)]
    if len(per_ranks) > 1:
        rows.append(fig(program, top["mode"], max(per_ranks), int(top["work"]), PROGRAMS[program].unit,
                        "serial_fraction", top["serial_fraction"], "1"))
    return Found(PROGRAMS[program].topic, max(per_ranks), rows)


def read(path: Path) -> Found:
    """The converter that fits this file's contents."""
    text = path.read_text()
    if path.suffix == ".csv":
        table = list(csv.DictReader(io.StringIO(text)))
        head = set(table[0]) if table else set()
        if {"sweep", "step_s"} <= head:
            return ddp_scaling(table)
        if {"mode", "version", "comm", "height"} <= head:
            return conv_scaling(table)
        if {"program", "ranks", "median_wall_s"} <= head:
            return scaling(table)
        raise RecordError(f"{path}: a CSV this script does not know (columns {sorted(head)})")
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    try:
        d = json.loads(text) if text.lstrip().startswith("{") and len(lines) <= 1 else json.loads(lines[-1])
    except (json.JSONDecodeError, IndexError):
        raise RecordError(f"{path}: neither CSV nor a JSON record") from None
    kinds = [("default_fast_config", matmul_bench), ("mc_counter_samples_per_s", pi_bench), ("ours", conv_throughput),
             ("max_rel_diff", ddp_equivalence)]
    for key, convert in kinds:
        if key in d:
            return convert(d)
    if d.get("benchmark") == "allreduce":
        return allreduce(d)
    if isinstance(d.get("results"), dict) and all("test_accuracy" in r for r in d["results"].values()):
        return ddp_digits(d)
    raise RecordError(f"{path}: a JSON record this script does not know (keys {sorted(d)[:12]})")


# ---------------------------------------------------------------- tables

def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as fh:
        return list(csv.DictReader(fh))


def write(path: Path, rows: list[dict]) -> None:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.getvalue())


def complete(found: Found, path: Path, given: dict, fallback: dict | None = None) -> list[dict]:
    """The rows with date, device, command, run and note filled: from ``given`` (the command line), else the
    result's own, else ``fallback`` (the suite's runs.jsonl); what is missing is an error that says how."""
    fallback = fallback or {}
    meta = {k: given.get(k) or getattr(found, k) or fallback.get(k, "") for k in ("date", "device", "command")}
    missing = [k for k, v in meta.items() if not v]
    if missing:
        raise RecordError(f"{path}: the result does not say its {' or '.join(missing)}: pass "
                          + " ".join(f"--{k} ..." for k in missing)
                          + " (or record the folder `make bench` wrote: its runs.jsonl says them)")
    note = "; ".join(x for x in (found.note, given.get("note") or fallback.get("note", "")) if x)
    date = re.match(r"\d{4}-\d\d-\d\d", meta["date"])
    if not date:
        raise RecordError(f"{path}: date {meta['date']!r} is not YYYY-MM-DD")
    run = given.get("run", "")
    if run and not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", run):
        raise RecordError(f"--run {run!r}: a short name of lower-case letters, digits, '-' and '.' "
                          "(it becomes part of keys)")
    return [{**r, "date": date.group(0), "run": run, "device": meta["device"], "command": meta["command"], "note": note,
             "size": number(r["size"], whole=True), **{k: number(r[k]) for k in ("value", "baseline_value", "ratio")}}
            for r in found.rows]


def add(rows: list[dict], table: Path) -> tuple[int, int]:
    """Put rows into a table, replacing the rows of the same run, program and variant: (added, replaced)."""
    old = load(table)
    new = {(r["run"], r["program"], r["variant"]) for r in rows}
    kept = [r for r in old if (r["run"], r["program"], r["variant"]) not in new]
    write(table, kept + rows)
    return len(rows), len(old) - len(kept)


def record(path: Path, given: dict, into: Path = RESULTS, fallback: dict | None = None) -> list[tuple[Path, int, int]]:
    """Record one result file, or every file a suite folder's runs.jsonl names: [(table, added, replaced)]."""
    if path.is_dir():
        manifest = path / "runs.jsonl"
        if not manifest.is_file():
            raise RecordError(f"{path} has no runs.jsonl: give the result files themselves, with --command")
        done = []
        for line in manifest.read_text().splitlines():
            entry = json.loads(line)
            done += record(path / entry["file"], given, into, entry)
        return done
    if not path.is_file():
        raise RecordError(f"{path}: no such file")
    try:
        found = read(path)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, RecordError):
            raise
        raise RecordError(f"{path}: the result lacks or mangles {exc} (written by another version of its "
                          "benchmark? its converter in benchmarks/record.py says what it reads)") from None
    if not found.rows:
        raise RecordError(f"{path}: the result holds no figures")
    rows = complete(found, path, given, fallback)
    table = into / f"{machine(rows[0]['device'], found.gpus)}_{found.topic}.csv"
    return [(table, *add(rows, table))]


def main(argv: list[str] | None = None) -> int:
    summary, usage = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(prog="benchmarks/record.py", description=summary, epilog=usage,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, help="result files, or folders written by the GPU suite")
    p.add_argument("--command", default="", help="the exact command that wrote the file")
    p.add_argument("--date", default="", help="YYYY-MM-DD (default: the result's own)")
    p.add_argument("--device", default="", help="the GPU's name, e.g. 'NVIDIA H200' (default: the result's own)")
    p.add_argument("--run", default="", help="a name to keep this run beside the record (default: it is the record)")
    p.add_argument("--note", default="", help="what a reader should know about this run")
    p.add_argument("--into", type=Path, default=RESULTS, help="folder of the tables (default benchmarks/results)")
    args = p.parse_args(argv)
    given = {k: getattr(args, k) for k in ("command", "date", "device", "run", "note")}
    try:
        for path in args.paths:
            for table, added, replaced in record(path, given, args.into):
                print(f"{table}: {added} rows" + (f" (replacing {replaced})" if replaced else ""))
    except (RecordError, OSError) as exc:
        print(f"record.py: error: {exc}", file=sys.stderr)
        return 1
    if args.into == RESULTS:
        print("now: python benchmarks/curate.py build   (hpclab/data/recorded.csv and the README's tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
