"""Recorded GPU results: this project's runs on H200 and H100 GPUs and the workshop's A100 runs.

``data/recorded.csv`` holds the rows of the curated tables in ``benchmarks/results/`` that the notebooks, the
README, docs/results.md and benchmarks/HISTORY.md quote or plot (``benchmarks/curate.py`` writes it), with a
``table`` column naming the table and without the runs' notes (they stay in the curated tables). :func:`keyed`
names each figure ``program/variant/run/<gpus>gpu/<size>/metric`` (run = the machine, h200x4, or
machine-name for a named run) and adds the ratio of a figure measured against a baseline in the
same run (``.../vs_cublas`` for a throughput, ``.../METRIC_vs_BASELINE`` otherwise). The workshop's A100
timings (``data/fasrc_a100.csv``) come in the same form, keyed ``a100/<exercise>/<gpus>gpu/wall_s``.
"""
from __future__ import annotations

import csv
import datetime
import io
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from hpclab.speedup import speedups

RUN_NAMES = {"h200": "1× H200", "h200x2": "2× H200 (NVLink)", "h200x4": "4× H200 (NVLink)", "h100": "1× H100"}


THROUGHPUT = {"tflops", "busbw", "rate"}          # their ratio to a baseline is "vs_BASELINE"
# The one row format of a measured figure: benchmarks' JSON "figures", the curated tables, data/recorded.csv
# (which leaves out the note).
FIELDS = ["date", "run", "device", "gpus", "program", "variant", "size", "size_unit", "metric", "value", "unit",
          "baseline", "baseline_value", "ratio", "command", "note"]


def figure(program, variant, gpus, size, size_unit, metric, value, unit, baseline="", base=None) -> dict:
    """One figure of a run; with the ``baseline`` measured in the same run (its value ``base``), the ratio.
    Date, run, device, command and note are the run's: benchmarks/record.py fills them in."""
    row = dict.fromkeys(FIELDS, "") | {"program": program, "variant": variant, "gpus": gpus, "size": size,
                                       "size_unit": size_unit, "metric": metric, "value": value, "unit": unit}
    if baseline and base:
        row.update(baseline=baseline, baseline_value=base, ratio=float(value) / float(base))
    return row


def keyed(rows) -> list[dict]:
    """Rows of the curated tables (each with its ``table``, e.g. ``h200x4_pi``) as keyed figures, each
    compared figure followed by its ratio to the baseline: the one definition of the keys."""
    out = []
    for r in rows:
        label, topic = r["table"].split("_", 1)
        run = label + (f"-{r['run']}" if r["run"] else "")
        stem = "/".join(p for p in (r["program"], r["variant"], run, f"{r['gpus']}gpu", r["size"]) if p)
        base = {"topic": topic, "program": r["program"], "variant": r["variant"], "run": run, "date": r["date"],
                "device": r["device"], "gpus": int(r["gpus"]), "size": int(r["size"]) if r["size"] else None,
                "size_unit": r["size_unit"], "command": r["command"], "note": r.get("note", ""),
                "source": f"benchmarks/results/{r['table']}.csv"}
        out.append({"key": f"{stem}/{r['metric']}", **base, "metric": r["metric"], "value": float(r["value"]),
                    "unit": r["unit"]})
        if r["baseline"]:
            metric = ("" if r["metric"] in THROUGHPUT else f"{r['metric']}_") + f"vs_{r['baseline']}"
            out.append({"key": f"{stem}/{metric}", **base, "metric": metric, "value": float(r["ratio"]), "unit": "1"})
    return out


@lru_cache(maxsize=1)
def _table() -> tuple[dict, ...]:
    text = resources.files("hpclab").joinpath("data/recorded.csv").read_text()
    return tuple(keyed(csv.DictReader(io.StringIO(text)))) + tuple(a100_rows())


def fasrc_a100(exercise: str | None = None) -> list[dict]:
    """The workshop's published A100 runs, optionally of one exercise (``ex2_pi_mc``). Each row's ``source``
    names its file in fasrc/User_Codes; ``date`` is the day its output was committed (the runs carry none)."""
    rows = []
    for row in csv.DictReader(io.StringIO(resources.files("hpclab").joinpath("data/fasrc_a100.csv").read_text())):
        if exercise in (None, row["exercise"]):
            row["gpus"], row["nodes"], row["work"] = int(row["gpus"]), int(row["nodes"]), int(row["work"])
            row["wall_s"] = float(row["wall_s"]) if row["wall_s"] else None
            rows.append(row)
    return rows


def a100_rows():
    """The workshop's A100 timings as rows of the table (keys ``a100/<exercise>/<gpus>gpu/wall_s``)."""
    for r in fasrc_a100():
        if r["wall_s"] is None:
            continue
        yield {"key": f"a100/{r['exercise']}/{r['gpus']}gpu/wall_s", "topic": "pi", "program": r["exercise"],
               "variant": "strong", "run": "a100", "date": r["date"], "device": "NVIDIA A100", "gpus": r["gpus"],
               "size": r["work"], "size_unit": r["unit"], "metric": "wall_s", "value": r["wall_s"], "unit": "s",
               "command": r["program"], "note": "", "source": r["source"]}


def rows(**where) -> list[dict]:
    """Rows whose fields equal the given values, e.g. ``rows(program="pi-mc", metric="wall_s")``."""
    return [dict(r) for r in _table() if all(r[k] == v for k, v in where.items())]


def get(key: str) -> dict:
    """The row with this key; a KeyError names close keys when there is none."""
    found = next((r for r in _table() if r["key"] == key), None)
    if found is not None:
        return dict(found)
    stem = key.rsplit("/", 2)[0]
    near = [r["key"] for r in _table() if r["key"].startswith(stem)][:8]
    raise KeyError(f"no recorded result {key!r}" + (f"; keys beginning {stem!r}: {near}" if near else ""))


def value(key: str) -> float:
    return get(key)["value"]


# ---------------------------------------------------------------- curves over GPU counts

@dataclass
class Curve:
    """One run's figures over GPU counts, labelled with device, date and problem size. ``points``: dicts with
    ranks, rate (work per second) and, where timed, seconds and work; ``mode``: strong or weak."""

    label: str
    mode: str
    unit: str                                  # what the work counts: samples, bins, rows ...
    points: list[dict] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)   # a live sweep's raw records (for the machine note)

    def _timed(self, which: int) -> list[tuple[int, float]]:
        timed = sorted((p for p in self.points if p.get("seconds")), key=lambda p: p["ranks"])
        ranks = [p["ranks"] for p in timed]
        se = speedups(ranks, [p["seconds"] for p in timed], self.mode) if len(timed) > 1 else []
        return [(n, pair[which]) for n, pair in zip(ranks, se)]

    def speedups(self) -> list[tuple[int, float]]:
        return self._timed(0)

    def efficiencies(self) -> list[tuple[int, float]]:
        return self._timed(1)


def _count(x: float) -> str:
    """40,000 or 3.2e12: a problem size as a reader would write it."""
    if x < 1e6:
        return f"{int(x):,}"
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def _run_name(run: str, device: str) -> str:
    """'4× H200 (NVLink)' for run h200x4 and for its named runs (h200x4-NAME)."""
    return RUN_NAMES.get(run.split("-", 1)[0], device.replace("NVIDIA ", ""))


def scaling(program: str, run: str, variant: str = "strong", metric: str = "wall_s", what: str = "") -> Curve:
    """A recorded sweep over GPU counts as a Curve (``metric``: the time per run or per step); ``what``
    starts the label (e.g. "strong, NCCL halos") where one figure shows several variants."""
    found = sorted(rows(program=program, run=run, variant=variant, metric=metric), key=lambda r: r["gpus"])
    if not found:
        raise KeyError(f"no recorded {metric} for {program} {variant} on {run}; runs: "
                       f"{sorted({(r['run'], r['variant']) for r in rows(program=program)})}")
    mode = "weak" if variant.startswith("weak") else "strong"
    first = found[0]
    size = f"{_count(first['size'] / first['gpus'])} {first['size_unit']} per GPU" if mode == "weak" \
        else f"{_count(first['size'])} {first['size_unit']}"
    label = f"{what + ': ' if what else ''}{_run_name(run, first['device'])}, {first['date']}, {size}"
    points = [{"ranks": r["gpus"], "seconds": r["value"], "work": r["size"], "rate": r["size"] / r["value"]}
              for r in found]
    return Curve(label, mode, first["size_unit"], points)


def a100(program: str) -> Curve:
    """The workshop's A100 runs of the exercise that matches ``program`` (ex2_pi_mc: pi-mc, ex1_pi_midpoint: pi-midpoint)."""
    exercise = next(r["exercise"] for r in fasrc_a100() if r["exercise"].split("_", 1)[1].replace("_", "-") == program)
    curve = scaling(exercise, "a100")
    curve.label = curve.label.replace("A100", "A100 (FASRC workshop)")
    return curve


# What each recorded pi-mc sweep ran, in curves("pi-mc")'s order (recorded.csv's notes; fasrc_a100.csv).
PI_MC_KERNELS = ("pi-mc with its earlier SplitMix64 kernel", "pi-mc with today's Philox4x32-7 kernel",
                 "the workshop's CUDA program, a generator per thread")


def curves(program: str) -> list[Curve]:
    """Every recorded curve of ``program`` to draw beside a live sweep of it."""
    if program == "pi-mc":                # the legend names the program and kernel each sweep ran
        out = [scaling("pi-mc", "h200x4"), scaling("pi-mc", "h200x2"), a100("pi-mc")]
        for curve, ran in zip(out, PI_MC_KERNELS):
            curve.label += f"; {ran}"
        return out
    if program == "pi-midpoint":          # no multi-GPU sweep was recorded: one GPU's rate, and the A100 point
        r = get("pi-midpoint/bench/h200/1gpu/rate")
        return [Curve(f"1× H200, {r['date']}, one GPU's rate (benchmarks/pi.py)", "strong", r["unit"].split("/")[0],
                      [{"ranks": 1, "rate": r["value"]}]), a100("pi-midpoint")]
    if program == "conv-halo":
        halos = {"mpi-host": "host-staged halos (V4)", "nccl": "NCCL halos (V5)"}
        return [scaling("conv-halo", "h200x4", f"{mode}-{comm}", what=f"{mode}, {halos[comm]}")
                for mode in ("strong", "weak") for comm in halos]
    if program == "ddp-scaling":
        return [scaling("ddp-scaling", "h200x4-bucket-updates", mode, "step_s", what=f"{mode}, 3 x 4096 MLP")
                for mode in ("weak", "strong")]
    raise KeyError(f"no recorded curves for {program!r}")


def live(summary: list[dict], unit: str, label: str, mode: str = "strong", records=()) -> Curve:
    """A sweep measured here (``Sweep.summary()`` rows: ranks, work, median_wall_s) as a Curve."""
    summary = sorted(summary, key=lambda r: r["ranks"])
    work = summary[0].get("work")
    size = "" if work is None else f", {_count(work)} {unit}" + (" per rank" if mode == "weak" else "")
    points = [{"ranks": r["ranks"], "seconds": r["median_wall_s"], "work": r.get("work"),
               "rate": (r["work"] * (r["ranks"] if mode == "weak" else 1)) / r["median_wall_s"]
               if r.get("work") else None} for r in summary]
    return Curve(f"{label}, {datetime.date.today().isoformat()}{size}", mode, unit, points, list(records))


def here(backend_name: str, ranks: int) -> str:
    """'here: simulator, 4 ranks': the label of a curve measured on this machine."""
    device = {"sim": "CUDA simulator", "gpu": "GPU"}.get(backend_name, backend_name)
    return f"here: {device}, {ranks} ranks"


def from_sweep(sweep, unit: str) -> Curve:
    """A :class:`hpclab.scaling.Sweep` as a live Curve, its records kept for ``plot.machine_note``. A weak
    sweep's records hold each run's whole work; the Curve counts it per rank, as :func:`live` expects."""
    backends = {r.get("backend") for r in sweep.records} - {None}
    label = here("/".join(sorted(backends)) or "?", max(r["ranks"] for r in sweep.records))
    summary = sweep.summary()
    if sweep.mode == "weak":
        summary = [{**r, "work": r["work"] // r["ranks"] if r.get("work") else r.get("work")} for r in summary]
    return live(summary, unit, label, sweep.mode, sweep.records)


def from_points(points: list[dict], unit: str, label: str, records=()) -> list[Curve]:
    """Live halo-exchange sweeps given as points (mode, ranks, height, wall_s): one Curve per mode present."""
    out = []
    for mode in ("strong", "weak"):
        summary = [{"ranks": p["ranks"], "median_wall_s": p["wall_s"],
                    "work": p["height"] // (p["ranks"] if mode == "weak" else 1)} for p in points if p["mode"] == mode]
        if summary:
            out.append(live(summary, unit, f"{mode}, {label}", mode, records))
    return out


def allreduce(run: str) -> dict[str, list[tuple[int, float, float]]]:
    """Recorded all-reduce per backend: (size in bytes, seconds, bus bandwidth GB/s), by size."""
    out: dict[str, list] = {}
    for r in sorted(rows(program="allreduce", run=run, metric="time_s"), key=lambda r: r["size"]):
        busbw = value(r["key"].rsplit("/", 1)[0] + "/busbw")
        out.setdefault(r["variant"], []).append((r["size"], r["value"], busbw))
    return out


def conv_points(run: str = "h200x4", comm: str = "mpi-host") -> list[dict]:
    """Recorded halo-exchange scaling as the points :func:`hpclab.halo.figures.scaling_figure` draws."""
    points = []
    for r in rows(program="conv-halo", run=run, metric="wall_s"):
        mode, via = r["variant"].split("-", 1)
        if via != comm:
            continue
        stem = r["key"].rsplit("/", 1)[0]
        points.append({"mode": mode, "ranks": r["gpus"], "height": r["size"], "wall_s": r["value"],
                       "compute": value(stem + "/compute_s"), "halo": value(stem + "/halo_s"), "transfer": 0.0})
    return sorted(points, key=lambda p: (p["mode"], p["ranks"]))


def describe(run: str) -> str:
    """'4× H200 (NVLink), 2026-11-22': where and when a recorded run was measured."""
    r = rows(run=run)[0]
    return f"{_run_name(run, r['device'])}, {r['date']}"
