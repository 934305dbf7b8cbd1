"""Write hpclab/data/recorded.csv, the curated table of recorded GPU results, from benchmarks/results/.

    python benchmarks/recorded_table.py           # rewrite the table
    python benchmarks/recorded_table.py --check   # exit 1 if the table differs from the result files

Each row is one figure of one recorded run: what was measured (topic, program,
variant), where (device, GPUs, date), at which problem size, the value and its
unit, the command that measured it and the result file it comes from. The
notebooks draw these curves beside what runs live and quote these numbers
(tests/test_recorded.py checks both the table and the quotes).
"""
from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TABLE = ROOT / "hpclab" / "data" / "recorded.csv"
FIELDS = ["key", "topic", "program", "variant", "run", "date", "device", "gpus", "size", "size_unit",
          "metric", "value", "unit", "command", "source"]
DATE = "2026-11-22"
H200 = "NVIDIA H200"
MPIRUN = 'mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE'


def row(topic, program, variant, run, gpus, size, size_unit, metric, value, unit, command, source,
        device=H200, date=DATE) -> dict:
    """One table row; its key joins what identifies it: program/variant/run/<gpus>gpu/<size>/metric."""
    parts = [program, variant, run, f"{gpus}gpu", str(size) if size != "" else "", metric]
    return {"key": "/".join(p for p in parts if p), "topic": topic, "program": program, "variant": variant,
            "run": run, "date": date, "device": device, "gpus": gpus, "size": size, "size_unit": size_unit,
            "metric": metric, "value": f"{float(value):.6g}", "unit": unit, "command": command,
            "source": str(Path(source).relative_to(ROOT))}


def _csv(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------- pi

def pi_scaling():
    """pi-mc strong scaling: 1/2/4 H200 (SplitMix64 generator) and 1/2 H200 (Philox4x32-7)."""
    runs = [("h200x4", "2026-11-22_h200x4/pi/pi-mc_strong.csv", "SplitMix64"),
            ("h200x2", "2026-11-22_h200x2/pi/pi-mc_strong.csv", "Philox4x32-7")]
    for run, name, generator in runs:
        path = RESULTS / name
        medians = {}
        for r in _csv(path):
            medians[int(r["ranks"])] = (int(r["work"]), float(r["median_wall_s"]), float(r["efficiency"]))
        ranks = ",".join(map(str, sorted(medians)))
        for n, (work, wall, eff) in sorted(medians.items()):
            command = (f'hpclab scaling pi-mc --ranks {ranks} --samples {work:.2g} --seed 123 --trials 3 '
                       f'--mpiexec "{MPIRUN}"  ({generator} generator)')
            for metric, value, unit in (("wall_s", wall, "s"), ("efficiency", eff, "1")):
                yield row("pi", "pi-mc", "strong", run, n, work, "samples", metric, value, unit, command, path)


def pi_bench():
    """One H200's rates from ``hpclab bench pi`` (the final run, Philox4x32-7 and the 4-bins-per-division midpoint)."""
    path = RESULTS / "2026-11-22_h200x2_final_pi_pytest_gemm.log"
    text = path.read_text()
    found = {
        "pi-mc": re.search(r"Monte Carlo, counter \(Philox4x32-7\)\s+([\d.e+]+) samples/s", text),
        "pi-midpoint": re.search(r"midpoint, 4 bins per division\s+([\d.e+]+) bins/s", text),
    }
    for program, match in found.items():
        unit = "samples/s" if program == "pi-mc" else "bins/s"
        yield row("pi", program, "bench", "h200", 1, "", "", "rate", float(match.group(1)), unit,
                  "CUDA_VISIBLE_DEVICES=0 hpclab bench pi", path)


# ---------------------------------------------------------------- all-reduce

def _size_text(nbytes: int) -> str:
    """4, 64, 1K, 256M, 1G: the way --sizes is written."""
    for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{suffix}"
    return str(nbytes)


def allreduce():
    """All-reduce time and bus bandwidth per backend and message size, on 4 and on 2 H200."""
    runs = [("h200x4", "2026-11-22_h200x4/comm/allreduce.json"), ("h200x2", "2026-11-22_h200x2_allreduce.txt")]
    for run, name in runs:
        path = RESULTS / name
        text = path.read_text()
        # A .json file holds the record; a run's log holds it as its one line that is JSON.
        data = json.loads(text if path.suffix == ".json" else
                          next(ln for ln in text.splitlines() if ln.startswith('{"benchmark"')))
        n = data["ranks"]
        sizes = ",".join(_size_text(b) for b in sorted({r["size_bytes"] for r in data["rows"]}))
        command = f"{MPIRUN} -n {n} hpclab bench allreduce --backend all --sizes {sizes} --json"
        for r in data["rows"]:
            if r["size_bytes"] < 64:   # the first size of a run includes NCCL's set-up: not a latency
                continue
            for metric, value, unit in (("time_s", r["time_us"] * 1e-6, "s"), ("busbw", r["busbw_GBps"], "GB/s")):
                yield row("comm", "allreduce", r["backend"], run, n, r["size_bytes"], "bytes", metric, value, unit,
                          command, path)


# ---------------------------------------------------------------- matrix multiply

def matmul():
    """TFLOP/s of cuBLAS and our three kernels on one H200, and each as a fraction of cuBLAS."""
    path = RESULTS / "2026-11-22_h200x4/matmul/matmul_bench.json"
    data = json.loads(path.read_text())
    default = data["default_fast_config"]
    for size, block in data["sizes"].items():
        for r in block["rows"]:
            if r["kernel"] == "fast" and r["config"] != default:
                continue                                # the tile-shape scan: not quoted
            for metric, value, unit in (("tflops", r["tflops"], "TFLOP/s"), ("vs_cublas", r["vs_cublas"], "1")):
                yield row("matmul", "matmul", r["kernel"], "h200", 1, int(size), "N", metric, value, unit,
                          f"hpclab bench matmul --sizes {','.join(data['sizes'])}", path)


def matmul_distributed():
    """Distributed GEMM (rows of A scattered, B broadcast, C gathered) on 1 and 2 H200."""
    path = RESULTS / "2026-11-22_h200x2/gemm-scaling/matmul_strong.csv"
    seen = set()
    for r in _csv(path):
        n = int(r["ranks"])
        if n in seen:
            continue
        seen.add(n)
        yield row("matmul", "matmul", "strong", "h200x2", n, int(r["work"]), "N", "wall_s", float(r["median_wall_s"]),
                  "s", f'hpclab scaling matmul --ranks 1,2 --work-arg=--n --n {r["work"]} --kernel fast --trials 3 '
                  f'--mpiexec "{MPIRUN}"', path)


# ---------------------------------------------------------------- convolution

def conv_throughput():
    """AlexNet C2 (batch 32) on one H200: our three methods and cuDNN, effective TFLOP/s back to back."""
    path = RESULTS / "2026-11-22_h200x4_final/conv/conv_throughput.json"
    data = json.loads(path.read_text())
    ours = data["ours"]
    methods = {"direct": ours[data["best_direct"]]["tflops"], "gemm": ours["gemm"]["tflops"],
               "winograd": ours["winograd"]["tflops"], "cudnn-fp32": data["cudnn_fp32"]["tflops"],
               "cudnn-tf32": data["cudnn_tf32"]["tflops"]}
    for method, tflops in methods.items():
        yield row("conv", "conv-c2", method, "h200", 1, 32, "images", "tflops", tflops, "TFLOP/s",
                  "hpclab bench conv throughput --batch 32", path)


def conv_scaling():
    """Halo-exchange scaling of a 96->256 5x5 layer 256 wide on 1/2/4 H200: host-staged (V4) and NCCL (V5) halos."""
    path = RESULTS / "2026-11-22_h200x4_plan_fix/conv/conv_scaling.csv"
    command = f"{MPIRUN} -n N hpclab bench conv scaling  (N = 1, 2, 4)"
    rows = _csv(path)
    for r in rows:
        # The 1-GPU run has no halo: it is the base of both the host-staged and the NCCL curves.
        comms = ["mpi-host", "nccl"] if r["ranks"] == "1" else [r["comm"]]
        for comm in comms:
            variant = f"{r['mode']}-{comm}"
            for metric, value in (("wall_s", r["wall_s"]), ("compute_s", r["compute_s"]),
                                  ("halo_s", r["halo_s"]), ("efficiency", r["efficiency"])):
                yield row("conv", "conv-halo", variant, "h200x4", int(r["ranks"]), int(r["height"]), "rows",
                          metric, float(value), "1" if metric == "efficiency" else "s", command, path)


# ---------------------------------------------------------------- data-parallel training

def ddp_scaling():
    """DDP throughput of the 3 x 4096 MLP on 1/2/4 H200: weak (1024 per GPU) and strong (2048 global)."""
    path = RESULTS / "2026-11-22_h200x4_rerun/ddp/ddp_scaling.csv"
    rows = _csv(path)
    base = {r["sweep"]: float(r["step_s"]) for r in rows if r["gpus"] == "1"}
    for r in rows:
        n, step = int(r["gpus"]), float(r["step_s"])
        eff = base[r["sweep"]] / step / (n if r["sweep"] == "strong" else 1)
        for metric, value, unit in (("step_s", step, "s"), ("samples_per_s", r["samples_per_s"], "samples/s"),
                                    ("comm_share", r["comm_share"], "1"), ("efficiency", eff, "1"),
                                    ("parameters", r["parameters"], "1")):
            yield row("ddp", "ddp-scaling", r["sweep"], "h200x4", n, int(r["global_batch"]), "samples",
                      metric, float(value), unit, f"{MPIRUN} -n {n} hpclab bench ddp --mode scaling", path)


def ddp_digits():
    """Test accuracy of the digits MLP trained on one H200 (float32 and mixed precision)."""
    path = RESULTS / "2026-11-22_h200x4_rerun/ddp/ddp_digits.json"
    data = json.loads(path.read_text())
    for precision, result in data["results"].items():
        yield row("ddp", "ddp-digits", precision, "h200", 1, "", "", "test_accuracy", result["test_accuracy"], "1",
                  "hpclab bench ddp --mode digits", path)


SOURCES = [pi_scaling, pi_bench, allreduce, matmul, matmul_distributed, conv_throughput, conv_scaling,
           ddp_scaling, ddp_digits]


def build() -> str:
    """The table as CSV text."""
    rows = [r for source in SOURCES for r in source()]
    keys = [r["key"] for r in rows]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise ValueError(f"duplicate keys: {sorted(duplicates)}")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def main(argv: list[str]) -> int:
    text = build()
    if "--check" in argv:
        if TABLE.read_text() != text:
            print(f"{TABLE.relative_to(ROOT)} differs from benchmarks/results/: "
                  "run python benchmarks/recorded_table.py", file=sys.stderr)
            return 1
        print(f"{TABLE.relative_to(ROOT)} matches benchmarks/results/")
        return 0
    TABLE.write_text(text)
    print(f"wrote {TABLE.relative_to(ROOT)} ({text.count(chr(10)) - 1} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
