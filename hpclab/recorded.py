"""Recorded GPU results: this project's runs on H200 GPUs (``data/recorded.csv``) and the workshop's A100 runs.

``data/recorded.csv`` is generated from the result files in ``benchmarks/results/``
by ``benchmarks/recorded_table.py``: one row per figure, with the device, the
number of GPUs, the date, the problem size, the command that measured it and
the file it comes from. Notebooks draw these curves beside the sweep that runs
live (on a laptop that is the simulator, which cannot show GPU speed) and quote
these numbers; ``tests/test_recorded.py`` checks the quotes against the table.

The workshop's A100 timings (:mod:`hpclab.reference`) are offered in the same
form, under keys ``a100/<exercise>/<gpus>gpu/wall_s``.
"""
from __future__ import annotations

import csv
import datetime
import io
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

# Which workshop exercise times the same program as ours.
A100_EXERCISE = {"pi-mc": "ex2_pi_mc", "pi-midpoint": "ex1_pi_midpoint"}
RUN_NAMES = {"h200": "1× H200", "h200x2": "2× H200 (NVLink)", "h200x4": "4× H200 (NVLink)"}


@lru_cache(maxsize=1)
def _table() -> tuple[dict, ...]:
    text = resources.files("hpclab").joinpath("data/recorded.csv").read_text()
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        r["gpus"], r["value"] = int(r["gpus"]), float(r["value"])
        r["size"] = int(r["size"]) if r["size"] else None
        rows.append(r)
    return tuple(rows) + tuple(_a100_rows())


def _a100_rows():
    from hpclab import reference

    for r in reference.fasrc_a100():
        if r["wall_s"] is None:
            continue
        yield {"key": f"a100/{r['exercise']}/{r['gpus']}gpu/wall_s", "topic": "pi", "program": r["exercise"],
               "variant": "strong", "run": "a100", "date": r["date"], "device": "NVIDIA A100", "gpus": r["gpus"],
               "size": r["work"], "size_unit": r["unit"], "metric": "wall_s", "value": r["wall_s"], "unit": "s",
               "command": r["program"], "source": r["source"]}


def rows(**where) -> list[dict]:
    """Rows whose fields equal the given values, e.g. ``rows(program="pi-mc", metric="wall_s")``."""
    return [dict(r) for r in _table() if all(r[k] == v for k, v in where.items())]


def get(key: str) -> dict:
    """The row with this key; a KeyError names close keys when there is none."""
    for r in _table():
        if r["key"] == key:
            return dict(r)
    stem = key.rsplit("/", 2)[0]
    near = [r["key"] for r in _table() if r["key"].startswith(stem)][:8]
    raise KeyError(f"no recorded result {key!r}" + (f"; keys beginning {stem!r}: {near}" if near else ""))


def value(key: str) -> float:
    return get(key)["value"]


# ---------------------------------------------------------------- curves over GPU counts

@dataclass
class Curve:
    """One run's figures over GPU counts, labelled with device, date and problem size.

    ``points``: dicts with ranks, rate (work per second) and, where timed,
    seconds and work. ``mode`` is strong (fixed total work) or weak (fixed work per GPU).
    """

    label: str
    mode: str
    unit: str                                  # what the work counts: samples, bins, rows ...
    points: list[dict] = field(default_factory=list)
    source: str = ""
    live: bool = False
    records: list[dict] = field(default_factory=list)   # a live sweep's raw records (for the machine note)

    def speedups(self) -> list[tuple[int, float]]:
        """(ranks, speedup) from the timed points: T(1)/T(n) strong, n T(1)/T(n) weak (scaled)."""
        timed = sorted((p for p in self.points if p.get("seconds")), key=lambda p: p["ranks"])
        if len(timed) < 2:
            return []
        base = timed[0]
        t1 = base["seconds"] * (base["ranks"] if self.mode == "strong" else 1)
        return [(p["ranks"], t1 / p["seconds"] * (1 if self.mode == "strong" else p["ranks"] / base["ranks"]))
                for p in timed]

    def efficiencies(self) -> list[tuple[int, float]]:
        return [(n, s / n) for n, s in self.speedups()]


def _count(x: float) -> str:
    """40,000 or 3.2e12: a problem size as a reader would write it."""
    if x < 1e6:
        return f"{int(x):,}"
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def _run_name(run: str, device: str) -> str:
    return RUN_NAMES.get(run, device.replace("NVIDIA ", ""))


def scaling(program: str, run: str, variant: str = "strong", metric: str = "wall_s", what: str = "") -> Curve:
    """A recorded sweep over GPU counts as a Curve (``metric`` is the time per run or per step).

    ``what`` starts the label, e.g. "strong, NCCL halos", where one figure shows several variants.
    """
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
    return Curve(label, mode, first["size_unit"], points, first["source"])


def a100(program: str) -> Curve:
    """The workshop's A100 runs of the exercise that matches ``program`` (pi-mc, pi-midpoint)."""
    exercise = A100_EXERCISE[program]
    curve = scaling(exercise, "a100")
    curve.label = curve.label.replace("A100", "A100 (FASRC workshop)")
    return curve


def bench_rate(program: str) -> Curve:
    """One GPU's throughput from ``hpclab bench`` as a one-point Curve (no time, no sweep)."""
    r = get(f"{program}/bench/h200/1gpu/rate")
    unit = r["unit"].split("/")[0]
    return Curve(f"1× H200, {r['date']}, one GPU's rate (hpclab bench)", "strong", unit,
                 [{"ranks": 1, "rate": r["value"]}], r["source"])


def curves(program: str) -> list[Curve]:
    """Every recorded curve of ``program`` to draw beside a live sweep of it."""
    if program == "pi-mc":
        return [scaling("pi-mc", "h200x4"), scaling("pi-mc", "h200x2"), a100("pi-mc")]
    if program == "pi-midpoint":          # no multi-GPU sweep was recorded: one GPU's rate, and the A100 point
        return [bench_rate("pi-midpoint"), a100("pi-midpoint")]
    if program == "conv-halo":
        halos = {"mpi-host": "host-staged halos (V4)", "nccl": "NCCL halos (V5)"}
        return [scaling("conv-halo", "h200x4", f"{mode}-{comm}", what=f"{mode}, {halos[comm]}")
                for mode in ("strong", "weak") for comm in halos]
    if program == "ddp-scaling":
        return [scaling("ddp-scaling", "h200x4", mode, "step_s", what=f"{mode}, 3 x 4096 MLP")
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
    return Curve(f"{label}, {datetime.date.today().isoformat()}{size}", mode, unit, points, live=True,
                 records=list(records))


def here(backend_name: str, ranks: int) -> str:
    """'here: simulator, 4 ranks': the label of a curve measured on this machine."""
    device = {"sim": "CUDA simulator", "gpu": "GPU"}.get(backend_name, backend_name)
    return f"here: {device}, {ranks} ranks"


def from_sweep(sweep, unit: str, label: str | None = None) -> Curve:
    """A :class:`hpclab.scaling.Sweep` as a live Curve, its records kept for :func:`hpclab.plot.machine_note`."""
    if label is None:
        backends = {r.get("backend") for r in sweep.records} - {None}
        label = here("/".join(sorted(backends)) or "?", max(r["ranks"] for r in sweep.records))
    return live(sweep.summary(), unit, label, sweep.mode, sweep.records)


def from_points(points: list[dict], unit: str, label: str, records=()) -> list[Curve]:
    """Live sweeps given as points (mode, ranks, height or work, wall_s): one Curve per mode present."""
    out = []
    for mode in ("strong", "weak"):
        mine = sorted((p for p in points if p["mode"] == mode), key=lambda p: p["ranks"])
        if mine:
            summary = [{"ranks": p["ranks"], "median_wall_s": p["wall_s"],
                        "work": p.get("work", p.get("height")) // (p["ranks"] if mode == "weak" else 1)}
                       for p in mine]
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
