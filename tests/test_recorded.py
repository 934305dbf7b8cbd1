"""The recorded GPU results: the table matches the result files, and numbers quoted in notebooks match the table.

A quoted number carries its key in an HTML comment right after it (invisible in JupyterLab):

    a 256 MiB all-reduce took 0.923 ms<!-- recorded: allreduce/nccl/h200x2/2gpu/268435456/time_s -->

The quote must equal the table's value converted to the quoted unit (%, ms, µs, M, ...) and
rounded to the digits quoted.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from hpclab import recorded

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!--\s*recorded:\s*(\S+)\s*-->")
NUMBER = re.compile(r"(\d{1,3}(?:[,\u2009\u202f ]\d{3})+|\d+(?:\.\d+)?(?:e[-+]?\d+)?)")
# Units a quote may use, as factors from the table's unit (s, fraction, count).
SCALE = {"%": 100.0, "ms": 1e3, "µs": 1e6, "us": 1e6, "ns": 1e9, "M": 1e-6}


def _generator():
    spec = importlib.util.spec_from_file_location("recorded_table", ROOT / "benchmarks" / "recorded_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_is_generated_from_the_result_files():
    text = _generator().build()
    assert (ROOT / "hpclab" / "data" / "recorded.csv").read_text() == text, \
        "hpclab/data/recorded.csv is out of date: run python benchmarks/recorded_table.py"


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
    eff = dict(pi[0].efficiencies())
    assert eff[4] == pytest.approx(recorded.value("pi-mc/strong/h200x4/4gpu/3200000000000/efficiency"), rel=1e-4)
    ddp = {c.mode: dict(c.efficiencies()) for c in recorded.curves("ddp-scaling")}
    assert ddp["weak"][4] == pytest.approx(recorded.value("ddp-scaling/weak/h200x4/4gpu/4096/efficiency"), rel=1e-4)
    assert ddp["strong"][4] == pytest.approx(recorded.value("ddp-scaling/strong/h200x4/4gpu/2048/efficiency"),
                                             rel=1e-4)
    assert [p["ranks"] for p in recorded.curves("pi-midpoint")[0].points] == [1]
    assert {p["mode"] for p in recorded.conv_points()} == {"strong", "weak"}
    assert set(recorded.allreduce("h200x2")) == {"mpi-host", "nccl", "raw-nccl"}
    with pytest.raises(KeyError, match="keys beginning"):
        recorded.get("pi-mc/strong/h200x4/8gpu/wall_s")


# ---------------------------------------------------------------- quoted numbers

def quote_problem(text_before: str, key: str) -> str | None:
    """None when the number just before a marker equals the table's value as quoted, else why not."""
    row = recorded.get(key)
    tail = re.sub(r"[*_`]+$", "", text_before.rstrip()).rstrip()
    match = re.search(NUMBER.pattern + r"\s*([^\s\d(]*)$", tail)
    if not match:
        return f"no number before the marker for {key}"
    number, unit = match.group(1), match.group(2)
    digits = re.sub(r"[,\u2009\u202f ]", "", number)
    quoted = float(digits)
    if unit in ("", row["unit"]) or unit == row["unit"].split("/")[0]:
        scale = 1.0
    elif unit in SCALE:
        scale = SCALE[unit]
    else:
        return f"{number} {unit}: unit {unit!r} cannot be compared with the table's {row['unit']!r} ({key})"
    mantissa, _, exponent = digits.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    half_step = 0.5 * 10.0 ** (-decimals) * (10.0 ** int(exponent) if exponent else 1.0)
    actual = row["value"] * scale
    if abs(quoted - actual) > half_step * (1 + 1e-9):
        return (f"quotes {number}{(' ' + unit) if unit else ''} but {key} is {row['value']:.6g} {row['unit']} "
                f"(= {actual:.6g} {unit or row['unit']}; source {row['source']})")
    return None


def _quotes(path: Path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for m in MARKER.finditer(cell.source):
            yield index, cell.source[:m.start()], m.group(1)


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_quoted_numbers_match_the_recorded_table(path):
    problems = [f"{path.parent.name}/{path.name} cell {index}: {why}"
                for index, before, key in _quotes(path) if (why := quote_problem(before, key))]
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
    ("the tiled one 15.4 %", "matmul/tiled/h200/1gpu/4096/vs_cublas", True),
    ("the tiled one 2 %", "matmul/tiled/h200/1gpu/4096/vs_cublas", False),
    ("adds 2.07e12 bins/s", "pi-midpoint/bench/h200/1gpu/rate", True),
    ("(50.3 M", "ddp-scaling/weak/h200x4/1gpu/1024/parameters", True),
    ("took 1.2 GB", "conv-halo/strong-mpi-host/h200x4/4gpu/32768/halo_s", False),   # unit that cannot be compared
    ("the A100's 45.2 s", "a100/ex2_pi_mc/1gpu/wall_s", True),
])
def test_quote_checker_catches_wrong_numbers(text, key, ok):
    assert (quote_problem(text, key) is None) == ok
