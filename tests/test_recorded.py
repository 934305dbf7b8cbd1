"""The recorded GPU results: the curated tables in benchmarks/results/ are the source; hpclab/data/recorded.csv
and the result tables of docs/results.md and the README are generated from them and must be current; every
figure quoted in the README's results, docs/results.md, benchmarks/HISTORY.md or a notebook carries its key and
matches the tables.

A quoted number carries its key in an HTML comment right after it (invisible when rendered):

    a 256 MiB all-reduce took 0.923 ms<!-- recorded: allreduce/nccl/h200x2/2gpu/268435456/time_s -->

The quote must equal the table's value converted to the quoted unit (%, ms, µs, M, ...) and
rounded to the digits quoted.
"""
from __future__ import annotations

import copy
import csv
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from hpclab.results import recorded

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    """benchmarks/NAME.py as a module (the scripts are not part of the installed package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


curate = _script("curate")
record = curate.record


def _bench_line(d: dict) -> dict:
    """What `python -m benchmarks allreduce --json` prints for these rows: its record, with its figures."""
    from benchmarks.allreduce import figures

    return {**d, "topic": "allreduce", "device_name": d["gpu"], "figures": figures(d["rows"], d["ranks"])}


def test_generated_files_are_current_and_quotes_match():
    """What `python benchmarks/curate.py check` checks: recorded.csv and the result tables of README.md,
    docs/results.md and benchmarks/HISTORY.md are what the curated tables give, every quote there and in the
    notebooks matches, no measured figure there is left unmarked, and no other markdown file quotes one."""
    assert curate.check() == []


def test_every_row_names_its_device_date_command_and_an_existing_source():
    rows = [r for r in recorded.rows() if r["run"] != "a100"]
    assert len({r["key"] for r in rows}) == len(rows)
    for r in rows:
        assert r["device"] and re.fullmatch(r"\d{4}-\d\d-\d\d", r["date"]) and r["command"], r
        assert (ROOT / r["source"]).is_file(), r["source"]


def test_curves_carry_labels_with_device_date_and_size():
    pi = recorded.curves("pi-mc")
    assert [sorted(p["ranks"] for p in c.points) for c in pi] == [[1, 2, 4], [1, 2], [1, 2, 4]]
    assert all(re.search(r"(H200|A100).*\d{4}-\d\d-\d\d.*samples", c.label) for c in pi)
    # Each legend entry names what ran: pi-mc's earlier kernel, today's, or the workshop's own program.
    assert [c.label.rsplit("; ", 1)[1] for c in pi] == list(recorded.PI_MC_KERNELS)
    assert "SplitMix64" in pi[0].label and "Philox4x32-7" in pi[1].label and "workshop" in pi[2].label
    eff = dict(pi[0].efficiencies())
    assert eff[4] == pytest.approx(recorded.value("pi-mc/strong/h200x4/4gpu/3200000000000/efficiency"), rel=1e-4)
    ddp = {c.mode: dict(c.efficiencies()) for c in recorded.curves("ddp-scaling")}
    run = "h200x4-bucket-updates"
    assert ddp["weak"][4] == pytest.approx(recorded.value(f"ddp-scaling/weak/{run}/4gpu/4096/efficiency"), rel=1e-4)
    assert ddp["strong"][4] == pytest.approx(recorded.value(f"ddp-scaling/strong/{run}/4gpu/2048/efficiency"),
                                             rel=1e-4)
    assert all(c.label.startswith(f"{c.mode}, 3 x 4096 MLP: 4× H200 (NVLink), 2026-11-26")
               for c in recorded.curves("ddp-scaling"))
    assert [p["ranks"] for p in recorded.curves("pi-midpoint")[0].points] == [1]
    assert {p["mode"] for p in recorded.conv_points()} == {"strong", "weak"}
    assert set(recorded.allreduce("h200x2")) == {"mpi-host", "nccl", "raw-nccl"}
    # A ratio is the figure over its baseline as its table row gives it (cuBLAS timed in turns with the kernel).
    ratio = recorded.get("matmul/naive/h200/1gpu/4096/vs_cublas")
    with open(Path(__file__).resolve().parent.parent / ratio["source"]) as fh:
        row = next(r for r in csv.DictReader(fh) if (r["run"], r["variant"], r["size"], r["metric"])
                   == ("", "naive", "4096", "tflops"))
    assert row["baseline"] == "cublas"
    assert ratio["value"] == pytest.approx(float(row["value"]) / float(row["baseline_value"]), rel=1e-6)
    with pytest.raises(KeyError, match="keys beginning"):
        recorded.get("pi-mc/strong/h200x4/8gpu/wall_s")


# ---------------------------------------------------------------- quoted numbers

def _quotes(path: Path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for before, key in curate.quotes(cell.source):
                yield index, before, key


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


def _problem(before: str, key: str) -> str | None:
    try:
        row = recorded.get(key)
    except KeyError as exc:
        return str(exc)
    return curate.quote_problem(before, key, row)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_quoted_numbers_match_the_recorded_table(path):
    problems = [f"{path.parent.name}/{path.name} cell {index}: {why}"
                for index, before, key in _quotes(path) if (why := _problem(before, key))]
    assert not problems, "\n".join(problems)


def test_notebooks_that_quote_gpu_figures_mark_them():
    counts = {p.name: sum(1 for _ in _quotes(p)) for p in NOTEBOOKS if p.parent.name == "notebooks"}
    for name in ("02_pi_midpoint.ipynb", "03_monte_carlo.ipynb", "04_matmul.ipynb", "05_gpu_communication.ipynb",
                 "06_conv_halo.ipynb", "07_data_parallel.ipynb"):
        assert counts[name] >= 2, f"{name} quotes recorded figures without markers"


@pytest.mark.parametrize("text, key, ok", [
    ("took 0.923 ms", "allreduce/nccl/h200x2/2gpu/268435456/time_s", True),
    ("took 0.91 ms", "allreduce/nccl/h200x2/2gpu/268435456/time_s", False),        # another run's figure
    ("took **243 ms**", "allreduce/mpi-host/h200x2/2gpu/268435456/time_s", True),
    ("took 324 ms", "allreduce/mpi-host/h200x2/2gpu/268435456/time_s", False),
    ("the tiled one 15.6 %", "matmul/tiled/h200/1gpu/4096/vs_cublas", True),
    ("the tiled one 2 %", "matmul/tiled/h200/1gpu/4096/vs_cublas", False),
    ("adds 2.07e12 bins/s", "pi-midpoint/bench/h200/1gpu/rate", True),
    ("(50.3 M", "ddp-scaling/weak/h200x4/1gpu/1024/parameters", True),
    ("took 1.2 GB", "conv-halo/strong-mpi-host/h200x4/4gpu/32768/halo_s", False),   # unit that cannot be compared
    ("the A100's 45.2 s", "a100/ex2_pi_mc/1gpu/wall_s", True),
])
def test_quote_checker_catches_wrong_numbers(text, key, ok):
    assert (_problem(text, key) is None) == ok


def test_measured_figures_in_prose_must_be_marked():
    text = ("took 1.2 ms and 0.87 at 4 GPUs (target ≥ 0.95), 1.16× raw NCCL, 25 % occupancy, 5×5 filters on "
            "4× H200 with Open MPI 4.1.6 on sm_90, 3 × 4096, `--samples 1e10`, 1 GiB, 20 epochs, "
            "**97.0 %**<!-- recorded: x/y --> and 0.7 ms<!-- recorded: x/z -->\n"
            "<!-- table: matmul\n| {{ tf(f('matmul/cublas/h200/1gpu/4096/tflops')) }} TFLOP/s |\n-->\n"
            "| 50.3 TFLOP/s |\n<!-- /table -->\n")       # a generated table: its template, then the table
    assert curate.unmarked_figures(text) == ["1.2 ms", "0.87", "1.16×", "25 %"]


def test_check_notices_a_table_that_disagrees_with_the_docs(tmp_path, monkeypatch):
    """A new run recorded (or a value edited) makes recorded.csv, the result tables and the quotes of the docs
    and of the notebooks stale."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    cublas = ",,NVIDIA H200,1,matmul,cublas,4096,N,tflops,{},"      # the record's run (no run name)
    for name, old, new in (("h200_matmul.csv", cublas.format("48.90538"), cublas.format("46.90538")),
                           ("h200_ddp.csv", ",fp32,,,train_s,0.4582587,", ",fp32,,,train_s,0.6,")):
        table = results / name
        assert old in table.read_text()
        table.write_text(table.read_text().replace(old, new))
    monkeypatch.setattr(curate, "RESULTS", results)
    problems = curate.check()
    assert problems[:2] == ["hpclab/data/recorded.csv is out of date with benchmarks/results/",
                            "docs/results.md's result tables are out of date with benchmarks/results/"]
    assert problems[2].startswith("docs/results.md: quotes 0.46 s but ddp-digits/fp32/h200/1gpu/train_s is 0.6 s")
    cublas, digits = ("quotes 48.9 TFLOP/s but matmul/cublas/h200/1gpu/4096/tflops is 46.9",
                      "quotes 0.46 s but ddp-digits/fp32/h200/1gpu/train_s is 0.6 s")
    cell = next(i for i, c in enumerate(nbformat.read(ROOT / "notebooks" / "07_data_parallel.ipynb", as_version=4).cells)
                if "ddp-digits/fp32/h200/1gpu/train_s" in c.source)
    quoted = [("notebooks/04_matmul.ipynb cell 7", cublas), (f"notebooks/07_data_parallel.ipynb cell {cell}", digits),
              ("solutions/04_matmul.ipynb cell 7", cublas), ("exercises/04_matmul.ipynb cell 7", cublas)]
    assert [p.split(": ")[0] for p in problems[3:]] == [where for where, _ in quoted], problems[3:]
    assert all(why in p for p, (_, why) in zip(problems[3:], quoted)), problems[3:]



def test_a_markdown_file_outside_the_docs_may_not_quote_figures(tmp_path, monkeypatch):
    """curate.check covers every file that quotes a recorded figure: one that DOCS do not list is named."""
    quote = "took 0.923 ms<!-- recorded: allreduce/nccl/h200x2/2gpu/268435456/time_s -->\n"
    for where, text in (("docs/notes.md", quote), ("docs/format.md", "a figure carries `<!-- recorded: KEY -->`\n"),
                        (".venv/lib/x.md", quote), ("build/y.md", quote), ("README.md", quote)):
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text(text)
    monkeypatch.setattr(curate, "ROOT", tmp_path)
    monkeypatch.setattr(curate, "DOCS", (tmp_path / "README.md",))
    assert [p.split(" ")[0] for p in curate.unlisted()] == ["docs/notes.md"]
    assert curate.measured(tmp_path / "other.md", "all of it") == "all of it"
    assert curate.measured(curate.README, "# x\n\n## Setup\nPython 3.10\n## Results on real GPUs\n0.5 ms\n## More\n") \
        == "## Results on real GPUs\n0.5 ms\n"

# ---------------------------------------------------------------- results -> curated rows

MATMUL = {"date": "2027-01-05T10:00:00+00:00", "command": "python -m benchmarks matmul --sizes 64 --out /tmp/x.json",
          "device": {"name": "NVIDIA H100 80GB HBM3"}, "default_fast_config": "128x128x8 / 8x8 vec4 pad4",
          "sizes": {"64": {"rows": [
              {"kernel": "cublas", "config": "CuPy matmul (cuBLAS SGEMM)", "tflops": 40.0},
              {"kernel": "fast", "config": "128x128x8 / 8x8 vec4 pad4", "tflops": 30.0, "regs_per_thread": 127},
              {"kernel": "fast", "config": "64x64x8 / 4x4 vec4 pad4", "tflops": 20.0, "cublas_tflops": 50.0}]}}}
ALLREDUCE = {"benchmark": "allreduce", "ranks": 2, "gpu": "NVIDIA H200", "rows": [
    {"backend": b, "size_bytes": s, "time_us": t, "busbw_GBps": bw} for b, s, t, bw in (
        ("nccl", 4, 100.0, 0.1), ("raw-nccl", 4, 90.0, 0.1),
        ("nccl", 1024, 20.0, 0.05), ("raw-nccl", 1024, 18.0, 0.0556))]}


def test_a_benchmark_json_becomes_curated_rows_with_its_comparison(tmp_path):
    from benchmarks.matmul import figures

    path = tmp_path / "matmul_bench.json"          # what `python -m benchmarks matmul --out` writes
    path.write_text(json.dumps({**MATMUL, "topic": "matmul", "device_name": MATMUL["device"]["name"],
                                "figures": figures(MATMUL)}))
    [(table, added, replaced)] = record.record(path, {}, tmp_path)
    assert table.name == "h100_matmul.csv" and (added, replaced) == (4, 0)
    rows = {(r["variant"], r["metric"]): r for r in record.load(table)}
    fast = rows["fast", "tflops"]
    assert (fast["date"], fast["device"], fast["size"], fast["unit"]) == ("2027-01-05", "NVIDIA H100 80GB HBM3", "64",
                                                                          "TFLOP/s")
    assert fast["command"] == "python3 -m benchmarks matmul --sizes 64"        # --out dropped
    assert (fast["baseline"], fast["baseline_value"], fast["ratio"]) == ("cublas", "40", "0.75")
    assert rows["fast-64x64x8-4x4-vec4-pad4", "tflops"]["ratio"] == "0.4"      # against cuBLAS timed in turns with it
    assert rows["fast", "regs_per_thread"]["value"] == "127" and not rows["cublas", "tflops"]["baseline"]


def test_a_new_run_replaces_the_record_and_a_named_run_stays_beside_it(tmp_path):
    path = tmp_path / "allreduce.json"
    path.write_text("benchmarks allreduce | 2 ranks\n" + json.dumps(_bench_line(ALLREDUCE)) + "\n")   # a log: its JSON line
    given = {"command": "$MPIRUN -n 2 python3 -m benchmarks allreduce --json", "date": "2027-01-05"}
    [(table, added, _)] = record.record(path, given, tmp_path)
    assert table.name == "h200x2_allreduce.csv" and added == 4               # the 4-byte size is not a latency
    nccl = {r["metric"]: r for r in record.load(table) if r["variant"] == "nccl"}
    assert nccl["time_s"]["ratio"] == "1.111111" and nccl["busbw"]["baseline"] == "raw-nccl"
    again = copy.deepcopy(ALLREDUCE)
    again["rows"][2]["time_us"] = 19.0
    path.write_text(json.dumps(_bench_line(again)))
    assert record.record(path, {**given, "date": "2027-01-06"}, tmp_path) == [(table, 4, 4)]
    assert {r["date"] for r in record.load(table)} == {"2027-01-06"}
    record.record(path, {**given, "run": "repeat"}, tmp_path)
    assert sorted({r["run"] for r in record.load(table)}) == ["", "repeat"] and len(record.load(table)) == 8


def test_a_result_without_its_command_says_how_to_give_it(tmp_path, capsys):
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps(_bench_line(ALLREDUCE)))
    assert record.main([str(path), "--into", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "does not say its date or command" in err and "--date" in err and "--command" in err
    path.write_text('{"something": 1}')
    assert record.main([str(path), "--into", str(tmp_path), "--command", "x", "--date", "2027-01-05"]) == 1
    assert "does not know" in capsys.readouterr().err


def test_the_suite_folder_names_each_files_command(tmp_path):
    (tmp_path / "comm").mkdir()
    from hpclab.cli.scaling import figures
    from hpclab.pi import run_mc
    from hpclab.scaling import Sweep

    (tmp_path / "comm" / "allreduce.json").write_text(json.dumps(_bench_line(ALLREDUCE)))
    (tmp_path / "pi").mkdir()
    sweep = Sweep("pi-mc", "strong", [{"ranks": n, "trial": 0, "work": 1000, "wall_s": t, "passed": True}
                                      for n, t in ((1, 2.0), (4, 0.52))])
    (tmp_path / "pi" / "pi-mc_strong.json").write_text(json.dumps(figures(sweep, run_mc)))   # what `hpclab scaling` writes
    entries = [{"file": "comm/allreduce.json", "command": "$MPIRUN -n 2 python3 -m benchmarks allreduce --json",
                "date": "2027-01-05T10:00:00Z", "device": "NVIDIA H200"},
               {"file": "pi/pi-mc_strong.json", "command": "python3 -m hpclab scaling pi-mc", "date": "2027-01-05",
                "device": "NVIDIA H200"}]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    done = record.record(tmp_path, {}, tmp_path / "tables")
    assert [(t.name, n) for t, n, _ in done] == [("h200x2_allreduce.csv", 4), ("h200x4_pi.csv", 7)]
    pi = {(r["gpus"], r["metric"]): r["value"] for r in record.load(tmp_path / "tables" / "h200x4_pi.csv")}
    assert pi["4", "wall_s"] == "0.52" and pi["4", "serial_fraction"] == f"{(0.52 / 2.0 - 1 / 4) / (1 - 1 / 4):.7g}"
    assert pi["4", "efficiency"] == f"{2.0 / 0.52 / 4:.7g}"


@pytest.mark.parametrize("device, gpus, name", [("NVIDIA H200", 4, "h200x4"), ("NVIDIA H100 80GB HBM3", 1, "h100"),
                                                ("NVIDIA A100-SXM4-80GB", 2, "a100x2"), ("Tesla V100", 1, "v100")])
def test_machine_names(device, gpus, name):
    assert record.machine(device, gpus) == name


def test_table_problems_catch_inconsistent_rows(tmp_path, monkeypatch):
    rows = record.load(ROOT / "benchmarks" / "results" / "h200_matmul.csv")[:3]
    rows[1] = {**rows[1], "ratio": "0.5"}
    rows[2] = {**rows[2], "command": ""}
    record.write(tmp_path / "h100_matmul.csv", rows)
    monkeypatch.setattr(curate, "RESULTS", tmp_path)
    problems = curate.table_problems()
    assert any("does not belong in h100_matmul.csv" in p for p in problems)
    assert any("line 3: ratio 0.5 is not value / baseline_value" in p for p in problems)
    assert any("line 4: date, device, command and unit are required" in p for p in problems)


def test_a_result_of_another_shape_or_a_bad_run_name_is_refused_clearly(tmp_path):
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps({"topic": "allreduce", "figures": [{"program": "allreduce", "gpus": 2}]}))
    with pytest.raises(record.RecordError, match="lacks or mangles 'size'"):
        record.record(path, {"command": "x", "date": "2027-01-05", "device": "NVIDIA H200"}, tmp_path)
    path.write_text(json.dumps(_bench_line(ALLREDUCE)))
    with pytest.raises(record.RecordError, match="--run 'my run'"):
        record.record(path, {"command": "x", "date": "2027-01-05", "run": "my run"}, tmp_path)


def test_the_package_carries_only_what_is_quoted_or_plotted():
    rows = curate.table_rows()
    kept = curate.shipped(rows)
    assert 0 < len(kept) < len(rows) / 2
    assert {r["key"] for r in recorded.rows()} >= {"matmul/cublas/h200/1gpu/4096/tflops",    # plotted in notebook 04
                                                   "ddp-digits/fp32/h200/1gpu/train_s"}      # quoted in docs/results.md
    assert sum(p.stat().st_size for p in (ROOT / "hpclab" / "data").iterdir()) <= 200_000
