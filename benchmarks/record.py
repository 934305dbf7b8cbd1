"""Add a run's figures to the curated tables, benchmarks/results/<machine>_<topic>.csv.

    python benchmarks/record.py build/bench   # `make bench`'s folder (runs.jsonl: each file's command, date, device)
    python benchmarks/record.py FILE --command "python3 -m benchmarks pi --json" [--date 2026-11-22]
                                     [--device "NVIDIA H200"] [--run NAME] [--note TEXT] [--into DIR]

A result file is a benchmark's JSON line (`python -m benchmarks ... --json`, `hpclab scaling`'s PROGRAM_MODE.json) whose
"figures" are rows of ``hpclab.results.recorded.figure``, with its "topic" and, where it knows them, "date",
"device_name", "command" and "note". Its table is named by the GPU and the job's GPU count (h200, h200x4). A record
replaces the rows of the same program, variant and run there (git keeps the old ones); --run NAME keeps it beside
them as a named run. Then `python benchmarks/curate.py build` regenerates recorded.csv and the result tables
(docs/results.md, the README's headline).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

from hpclab.results.recorded import FIELDS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


class RecordError(Exception):       # not a ValueError: record() turns those into "lacks or mangles"
    pass


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


def read(path: Path) -> dict:
    """The result's JSON: the whole file, or its last line that holds figures (a log)."""
    text = path.read_text()
    try:
        d = json.loads(text)
    except json.JSONDecodeError:
        found = [line for line in text.splitlines() if line.startswith("{") and '"figures"' in line]
        d = json.loads(found[-1]) if found else {}
    if not isinstance(d, dict) or "figures" not in d:
        raise RecordError(f"{path}: a result this script does not know (no JSON line with \"figures\")")
    return d


def complete(d: dict, path: Path, given: dict, fallback: dict) -> list[dict]:
    """The rows with date, device, command, run and note filled: from ``given`` (the command line), else the
    result's own, else ``fallback`` (the suite's runs.jsonl); what is missing is an error that says how."""
    own = {"date": d.get("date", ""), "device": d.get("device_name", ""), "command": d.get("command", "")}
    meta = {k: given.get(k) or own[k] or fallback.get(k, "") for k in own}
    missing = [k for k, v in meta.items() if not v]
    if missing:
        flags = " ".join(f"--{k} ..." for k in missing)
        raise RecordError(f"{path}: the result does not say its {' or '.join(missing)}: pass {flags} "
                          "(or record the folder `make bench` wrote: its runs.jsonl says them)")
    date = re.match(r"\d{4}-\d\d-\d\d", meta["date"])
    if not date:
        raise RecordError(f"{path}: date {meta['date']!r} is not YYYY-MM-DD")
    run = given.get("run", "")
    if run and not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", run):
        raise RecordError(f"--run {run!r}: a short name of lower-case letters, digits, '-' and '.' "
                          "(it becomes part of keys)")
    command = re.sub(r"^python -m ", "python3 -m ", re.sub(r"\s--out\s+\S+", "", meta["command"]))
    note = "; ".join(x for x in (d.get("note", ""), given.get("note") or fallback.get("note", "")) if x)
    return [{**r, "date": date.group(0), "run": run, "device": meta["device"], "note": note,
             "size": number(r["size"], True), "command": command,
             **{k: number(r[k]) for k in ("value", "baseline_value", "ratio")}} for r in d["figures"]]


def load(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text()))) if path.exists() else []


def csv_text(rows: list[dict], fields: list[str] = FIELDS) -> str:
    out = io.StringIO()
    csv.DictWriter(out, fieldnames=fields, lineterminator="\n").writerows([dict(zip(fields, fields)), *rows])
    return out.getvalue()


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(csv_text(rows))


def record(path: Path, given: dict, into: Path = RESULTS, fallback: dict | None = None) -> list[tuple[Path, int, int]]:
    """Record one result file, or every file a suite folder's runs.jsonl names: [(table, added, replaced)]."""
    if path.is_dir():
        manifest = path / "runs.jsonl"
        if not manifest.is_file():
            raise RecordError(f"{path} has no runs.jsonl: give the result files themselves, with --command")
        entries = [json.loads(line) for line in manifest.read_text().splitlines()]
        return [done for e in entries for done in record(path / e["file"], given, into, e)]
    d = read(path)
    try:
        rows = complete(d, path, given, fallback or {})
        table = into / f"{machine(rows[0]['device'], max(int(r['gpus']) for r in rows))}_{d['topic']}.csv"
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"{path}: the result lacks or mangles {exc} (written by another version of its "
                          "benchmark? hpclab.results.recorded.figure says what a figure holds)") from None
    old, new = load(table), {(r["run"], r["program"], r["variant"]) for r in rows}
    kept = [r for r in old if (r["run"], r["program"], r["variant"]) not in new]
    write(table, kept + rows)
    return [(table, len(rows), len(old) - len(kept))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/record.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, help="result files, or folders written by the GPU suite")
    for name in ("command", "date", "device", "run", "note"):     # default: the result's own (see above)
        p.add_argument(f"--{name}", default="")
    p.add_argument("--into", type=Path, default=RESULTS, help="folder of the tables (default benchmarks/results)")
    args = p.parse_args(argv)
    try:
        for path in args.paths:
            for table, added, replaced in record(path, vars(args), args.into):
                print(f"{table}: {added} rows" + (f" (replacing {replaced})" if replaced else ""))
    except (RecordError, OSError) as exc:
        print(f"record.py: error: {exc}", file=sys.stderr)
        return 1
    if args.into == RESULTS:
        print("now: python benchmarks/curate.py build   (hpclab/data/recorded.csv and the result tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
