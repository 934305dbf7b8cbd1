"""The curated GPU results (benchmarks/results/<machine>_<topic>.csv) -> what is made from them.

    python benchmarks/curate.py build    # rewrite hpclab/data/recorded.csv and the result tables of DOCS
    python benchmarks/curate.py check    # exit 1 if any is out of date, or a quoted figure disagrees

DOCS are the markdown files that quote recorded figures: README.md (its headline table), docs/results.md (the
result tables) and benchmarks/HISTORY.md (how the figures came about); the notebooks' markdown quotes them too.
recorded.csv carries the rows that any of them quotes, or a notebook plots (:data:`PLOTTED`). A block
``<!-- table: NAME`` holds a template up to ``-->``, then the table made from it up to ``<!-- /table -->``;
each ``{{ expression }}`` is Python over ``f(KEY)`` (a figure's value), ``row(KEY)``, ``caption(KEY, where)`` and
the formats below. A figure quoted in prose carries its key in a comment right after it and must equal the
table's value in the quoted unit, rounded to the digits quoted:
``0.923 ms<!-- recorded: allreduce/nccl/h200x2/2gpu/268435456/time_s -->``. Every other measured figure in a
DOC (see :func:`measured`) must sit in a generated table, and no other markdown file may quote one.
"""
from __future__ import annotations

import os
import re
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: the tables' columns and files)
from record import RESULTS, ROOT  # noqa: E402

from hpclab.results import recorded  # noqa: E402

RECORDED = ROOT / "hpclab" / "data" / "recorded.csv"
README = ROOT / "README.md"
RESULTS_MD = ROOT / "docs" / "results.md"
HISTORY = ROOT / "benchmarks" / "HISTORY.md"
DOCS = (README, RESULTS_MD, HISTORY)            # the markdown that quotes recorded figures, tables filled here
NOTEBOOK_FOLDERS = ("notebooks", "solutions", "exercises")
SKIPPED = {".git", ".venv", "build", "my-work", "node_modules"}   # folders of no markdown that ships
BLOCK = re.compile(r"(<!-- table: (\S+)\n(.*?)-->\n)(.*?)(<!-- /table -->)", re.S)
FIELD = re.compile(r"\{\{(.*?)\}\}")
MARKER = re.compile(r"<!--\s*recorded:\s*(\S+)\s*-->")
NUMBER = re.compile(r"(\d{1,3}(?:[,\u2009\u202f ]\d{3})+|\d+(?:\.\d+)?(?:e[-+]?\d+)?)")
SCALE = {"%": 100.0, "ms": 1e3, "µs": 1e6, "us": 1e6, "ns": 1e9, "M": 1e-6, "×": 1.0}   # quoted unit <- the table's
# What the notebooks plot: recorded's curves, conv_points and allreduce, and notebooks 04 and 07's rows().
PLOTTED = [{"program": "pi-mc", "variant": "strong", "metric": "wall_s"}, {"program": "conv-halo", "run": "h200x4"},
           {"program": "pi-midpoint", "variant": "bench", "run": "h200", "metric": "rate"},
           {"program": "ddp-scaling", "run": "h200x4-bucket-updates", "metric": "step_s"},
           {"program": "ddp-scaling", "run": "h200x2", "gpus": 2}, {"program": "allreduce", "metric": "time_s"},
           {"program": "allreduce", "metric": "busbw"}, {"program": "matmul", "run": "h200", "size": 4096, "metric": "tflops"}]


def tables() -> dict[str, list[dict]]:      # every curated table by file name (h200x4_pi.csv), rows as written
    return {p.name: record.load(p) for p in sorted(RESULTS.glob("*_*.csv"))}


def table_rows() -> list[dict]:          # every curated row, with its table's name (h200x4_pi)
    return [{"table": name[:-4], **r} for name, rows in tables().items() for r in rows]


def lookup(rows: list[dict]) -> dict:         # the keyed figures that quotes and templates see, A100 runs too
    return {r["key"]: r for r in [*recorded.keyed(rows), *recorded.a100_rows()]}


def rel(path: Path) -> str:                # docs/results.md
    return path.relative_to(ROOT).as_posix()


def notebooks() -> list[Path]:
    return [p for folder in NOTEBOOK_FOLDERS for p in sorted((ROOT / folder).glob("*.ipynb"))]


def notebook_markdown(path: Path) -> list[tuple[int, str]]:
    """(cell index, source) of a notebook's markdown cells."""
    return [(i, c.source) for i, c in enumerate(nbformat.read(path, as_version=4).cells) if c.cell_type == "markdown"]


def shipped(rows: list[dict], texts: list[str] | None = None) -> list[dict]:
    """The rows that recorded.csv carries: quoted in DOCS (markers, templates) or in the notebooks' markdown,
    or plotted (a row counts with its ratio)."""
    if texts is None:
        texts = [d.read_text() for d in DOCS] + [t for p in notebooks() for _, t in notebook_markdown(p)]
    keys = {k for t in texts for k in MARKER.findall(t)} | {k for t in texts
                                                          for k in re.findall(r'(?:f|row|caption)\("([^"]+)"', t)}
    return [r for r in rows if any(k["key"] in keys or any(w.items() <= k.items() for w in PLOTTED)
                                   for k in recorded.keyed([r]))]


def table_problems() -> list[str]:
    """Rows that are not a complete, consistent figure, and tables named after another machine."""
    problems = []
    for name, rows in tables().items():
        keys, jobs = set(), {}
        for r in rows:                          # a run of a program is one job: its GPU count names the machine
            jobs[r["run"], r["program"]] = max(jobs.get((r["run"], r["program"]), 1), int(r["gpus"]))
        for i, r in enumerate(rows, 2):
            where, gpus = f"benchmarks/results/{name} line {i}", jobs[r["run"], r["program"]]
            if not re.fullmatch(r"\d{4}-\d\d-\d\d", r["date"]) or not (r["device"] and r["command"] and r["unit"]):
                problems.append(f"{where}: date, device, command and unit are required")
            if record.machine(r["device"], gpus) != name.split("_")[0]:
                problems.append(f"{where}: {r['device']} on {gpus} GPU(s) does not belong in {name}")
            ratio = float(r["ratio"] or 0)
            if r["baseline"] and abs(float(r["value"]) / float(r["baseline_value"]) - ratio) > 1e-5 * abs(ratio):
                problems.append(f"{where}: ratio {r['ratio']} is not value / baseline_value")
            key = (r["run"], r["program"], r["variant"], r["gpus"], r["size"], r["metric"])
            if key in keys:
                problems.append(f"{where}: a second row for {key}")
            keys.add(key)
    return problems


def fixed(x: float, decimals: int) -> str:
    """x with this many decimals, halves rounded up (2.065 -> 2.07, as a reader rounds)."""
    return f"{Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-decimals), ROUND_HALF_UP):f}"


def sig(x: float, digits: int = 3) -> str:
    """x to this many significant digits: 20.0, 612, 1.205"""
    x = float(fixed(x, digits - 1 - Decimal(repr(float(x))).adjusted())) if x else 0.0      # rounded: 9.996 -> 10.0
    return fixed(x, max(0, digits - 1 - Decimal(repr(x)).adjusted())) if x else "0"


def sci(x: float, decimals: int = 2) -> str:          # 8.20e11, 5.6e-6
    exponent = Decimal(repr(float(sig(x, decimals + 1)))).adjusted()
    return f"{fixed(float(x) / 10 ** exponent, decimals)}e{exponent}"


def seconds(x: float) -> str:                         # 612 µs, 1.205 ms, 307.3 ms, 1.20 s
    return f"{sig(x * 1e6, 3)} µs" if x < 1e-3 else f"{sig(x * 1e3, 4)} ms" if x < 1 else f"{sig(x, 3)} s"


FORMATS = {"fixed": fixed, "sig": sig, "sci": sci, "seconds": seconds,
           "tf": lambda x: fixed(x, 1 if x >= 10 else 2),                            # 50.3, 7.75 (TFLOP/s)
           "count": lambda x: f"{int(Decimal(repr(float(x))).quantize(1, ROUND_HALF_UP)):,}".replace(",", " "),
           "met": lambda ok: "met" if ok else "NOT met"}


def fill(template: str, by_key: dict) -> str:
    """A table's template with every {{ expression }} evaluated."""
    def row(key):
        if key not in by_key:
            raise KeyError(f"a result table needs {key}, which no curated table has")
        return by_key[key]

    def caption(key, where):
        """'One H200, 2026-11-22: `command`' for the run of ``key``."""
        command, _, more = row(key)["command"].partition("   (")        # '... (N = 1, 2, 4)': one job per rank count
        return f"{where}, {row(key)['date']}: `{command}`" + (f" ({more}" if more else "")

    names = {"f": lambda key: row(key)["value"], "row": row, "caption": caption, "recorded": recorded, **FORMATS}
    return FIELD.sub(lambda m: str(eval(m.group(1), names)), template)  # noqa: S307 - our own docs


def number_before(text: str):
    """The number (and its unit) that ends a text, as quoted before a marker: a match, or None."""
    return re.search(NUMBER.pattern + r"\s*([^\s\d(]*)$", re.sub(r"[*_`]+$", "", text.rstrip()).rstrip())


def quote_problem(text_before: str, key: str, row: dict) -> str | None:
    """None when the number just before a marker equals the row's value as quoted, else why not."""
    match = number_before(text_before)
    if not match:
        return f"no number before the marker for {key}"
    number, unit = match.groups()
    digits = re.sub(r"[,\u2009\u202f ]", "", number)
    scale = 1.0 if unit in ("", row["unit"], row["unit"].split("/")[0]) else SCALE.get(unit)
    if scale is None:
        return f"{number} {unit}: unit {unit!r} cannot be compared with the table's {row['unit']!r} ({key})"
    mantissa, _, exponent = digits.lower().partition("e")
    half_step = 0.5 * 10.0 ** (int(exponent or 0) - len(mantissa.partition(".")[2]))      # half the last digit
    actual = float(row["value"]) * scale
    if abs(float(digits) - actual) > half_step * (1 + 1e-9):
        return (f"quotes {number}{(' ' + unit) if unit else ''} but {key} is {float(row['value']):.6g} {row['unit']} "
                f"(= {actual:.6g} {unit or row['unit']}; source {row['source']})")
    return None


def quotes(text: str) -> list[tuple[str, str]]:
    """(text before the marker, key) for every marker in a text."""
    return [(text[:m.start()], m.group(1)) for m in MARKER.finditer(text)]


# A measured figure in prose: a decimal (0.87, 5.5e-16) or a number with a unit of time, rate, bandwidth or
# share, or a ratio (1.16×; not 5×5 nor 4× H200); not a version (4.1.6) nor a target (≥ 0.95).
PROSE_NUMBER = re.compile(r"(?<![\w.])(?<![≥≤] )(\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.]*\.\d)(?!\w)")
UNIT = re.compile(r"\s*(?:%|×(?!\s*[\dA-Z])|µs|us|ms|ns|s\b|TFLOP/s|GB/s|samples/s|bins/s)")


def unmarked_figures(section: str) -> list[str]:
    """Measured figures in a text's prose that are neither in a generated table nor quoted with a marker."""
    text = re.sub(r"`[^`]*`", "", BLOCK.sub("", section))         # no tables, commands or names
    for m in reversed(list(MARKER.finditer(text))):
        quoted = number_before(text[:m.start()])
        text = text[:quoted.start() if quoted else m.start()] + text[m.end():]
    numbers = [(m.group(1), UNIT.match(text, m.end())) for m in PROSE_NUMBER.finditer(text)]
    return [n + (unit.group(0) if unit else "") for n, unit in numbers if unit or re.search(r"[.e]", n)]


def measured(doc: Path, text: str) -> str:
    """The part of a DOC whose measured figures must each be generated or quoted with a key: README.md's
    'Results on real GPUs' section (the rest of it states versions and sizes), the other DOCS whole."""
    if doc != README:
        return text
    found = re.search(r"^## Results on real GPUs.*?(?=^## |\Z)", text, re.S | re.M)
    return found.group(0) if found else ""


def stale() -> dict[Path, str]:
    """What recorded.csv and DOCS must hold, made from the curated tables, where they hold something else."""
    rows = table_rows()
    by_key = lookup(rows)
    # the package carries each figure with its date, device and command; a run's note stays in benchmarks/results/
    fields = ["table", *(f for f in record.FIELDS if f != "note")]
    made = {RECORDED: record.csv_text([{f: r[f] for f in fields} for r in shipped(rows)], fields)}
    for doc in DOCS:
        text = doc.read_text()
        made[doc] = BLOCK.sub(lambda m: m.group(1) + fill(m.group(3), by_key) + m.group(5), text)
    return {path: t for path, t in made.items() if not path.exists() or path.read_text() != t}


def markdown_files() -> list[Path]:
    """Every markdown file of the checkout, outside SKIPPED folders and hidden ones."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED and not d.startswith("."))
        found += [Path(folder) / f for f in sorted(files) if f.endswith(".md")]
    return found


def unlisted() -> list[str]:
    """Markdown files outside DOCS that quote a recorded figure or hold a result table: nothing would check them."""
    found = []
    for path in markdown_files():
        text = re.sub(r"`[^`]*`", "", path.read_text(errors="replace"))      # the marker's syntax, shown as code
        if path not in DOCS and (MARKER.search(text) or BLOCK.search(text)):
            found.append(f"{rel(path)} quotes recorded figures: move them to docs/results.md or "
                         "benchmarks/HISTORY.md, or add the file to curate.DOCS")
    return found


def check() -> list[str]:
    missing = [f"{rel(d)} is missing" for d in DOCS if not d.exists()]
    if missing:
        return missing
    named = {RECORDED: "hpclab/data/recorded.csv is", **{d: f"{rel(d)}'s result tables are" for d in DOCS}}
    problems = table_problems() + [f"{named[path]} out of date with benchmarks/results/" for path in stale()]
    by_key = lookup(table_rows())

    def why(before: str, key: str) -> str | None:
        return quote_problem(before, key, by_key[key]) if key in by_key else f"no recorded figure {key}"

    for doc in DOCS:
        text = doc.read_text()
        problems += [f"{rel(doc)}: {w}" for b, k in quotes(text) if (w := why(b, k))]
        problems += [f"{rel(doc)}: {x!r} is neither in a generated table nor quoted with its key"
                     for x in unmarked_figures(measured(doc, text))]
    for path in notebooks():
        problems += [f"{rel(path)} cell {i}: {w}" for i, source in notebook_markdown(path)
                     for b, k in quotes(source) if (w := why(b, k))]
    return problems + unlisted()


def main(argv: list[str]) -> int:
    if argv not in (["build"], ["check"]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv == ["build"]:
        for path, text in stale().items():
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    problems = check()
    print("".join(f"error: {p}\n" for p in problems), end="", file=sys.stderr)
    if problems:
        print("run `python benchmarks/curate.py build` (generated from benchmarks/results/); a quoted figure that "
              "disagrees is fixed by hand", file=sys.stderr)
        return 1
    print(f"hpclab/data/recorded.csv, {', '.join(rel(d) for d in DOCS)} and the notebooks' quotes match "
          f"benchmarks/results/ ({len(tables())} tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
