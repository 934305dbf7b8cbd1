"""Per-rank timelines from CUDA events: what each stream of each rank did, and when.

A :class:`Timeline` records an event on a stream where a piece of work begins and one where it ends,
against an origin recorded just after a barrier (a time zero shared up to the barrier's skew); the DDP
trainer and the halo exchange take one. The simulator's events keep no time: there a mark is the host's
clock, which keeps the order, not GPU time. ``benchmarks/perf_record.py timeline`` records them on GPUs.
"""
from __future__ import annotations

import csv
import io
import time
from contextlib import contextmanager, nullcontext
from importlib import resources
from types import SimpleNamespace

import numpy as np

from hpclab import backend
from hpclab.results import plot  # the figure helpers

KINDS = {"compute": "tab:blue", "comm": "tab:orange", "copy": "tab:green"}


class Timeline:
    """Named spans of GPU work on this rank's streams, for one step (its events are freed with it)."""

    def start(self, comm) -> None:
        """Time zero, on every rank at once: the device idle, a barrier, the origin event."""
        backend.cuda().synchronize()
        comm.Barrier()
        self.comm, self.sim, self._spans, self._open = comm, backend.is_simulator(), [], {}
        self._origin = self._mark(0)

    def _mark(self, stream):
        if self.sim:
            return time.perf_counter()
        event = backend.cuda().event()
        event.record(stream)
        return event

    @contextmanager
    def span(self, name: str, kind: str, stream=0, lane: str = "default stream"):
        begin = self._mark(stream)
        yield
        self._spans.append((name, kind, lane, begin, self._mark(stream)))

    def cut(self, name: str | None, kind: str = "compute", stream=0, lane: str = "default stream") -> None:
        """End the lane's running span here and begin ``name`` (None: begin nothing)."""
        mark = self._mark(stream)
        if lane in self._open:
            self._spans.append((*self._open.pop(lane), mark))
        if name:
            self._open[lane] = (name, kind, lane, mark)

    def spans(self) -> list[dict] | None:
        """Every rank's spans, in milliseconds from time zero in the order recorded, on rank 0 (None elsewhere)."""
        backend.cuda().synchronize()
        ms = (lambda m: 1e3 * (m - self._origin)) if self.sim else self._origin.elapsed_time
        parts = self.comm.gather([{"rank": self.comm.rank, "lane": lane, "kind": kind, "name": name,
                                   "start_ms": ms(b), "end_ms": ms(e)} for name, kind, lane, b, e in self._spans])
        return [s for part in parts for s in part] if parts is not None else None


# What the hooks use when no timeline is asked for: nothing recorded.
OFF = SimpleNamespace(span=lambda *args, **kwargs: nullcontext(), cut=lambda *args, **kwargs: None)


# ---------------------------------------------------------------- recorded runs, the figure

def read(text: str | None = None) -> dict[str, list[dict]]:
    """Runs of a CSV of spans (benchmarks/perf_record.py; default: the recorded ``data/timeline.csv``), by run name."""
    text = text if text is not None else resources.files("hpclab").joinpath("data/timeline.csv").read_text()
    runs: dict[str, list[dict]] = {}
    for r in csv.DictReader(io.StringIO(text)):
        r.update(rank=int(r["rank"]), start_ms=float(r["start_ms"]), end_ms=float(r["end_ms"]))
        runs.setdefault(r["run"], []).append(r)
    return runs


def recorded_figure(prefix: str):
    """The figure of the recorded runs whose names begin with ``prefix`` (``data/timeline.csv``), or None."""
    runs = {name: spans for name, spans in read().items() if name.startswith(prefix)}
    if not runs:
        return None
    first = next(iter(runs.values()))
    return figure(runs, f"recorded on {len({s['rank'] for s in first})} x {first[0]['device']}, {first[0]['date']}",
                  "Recorded on GPUs (hpclab/data/timeline.csv): CUDA events on each rank's streams.")


def figure(runs: dict[str, list[dict]], title: str, note: str | None = None):
    """One panel per run, on one time axis: a row per rank and stream, a bar per span, by kind."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    lanes = {name: sorted({(s["rank"], s["lane"]) for s in spans}) for name, spans in runs.items()}
    fig = Figure(figsize=(11, 1.2 + 0.42 * sum(len(v) + 1 for v in lanes.values())), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(runs), 1, sharex=True))
    end = max(s["end_ms"] for spans in runs.values() for s in spans)
    for ax, (name, spans) in zip(axes, runs.items()):
        rows = lanes[name]
        for s in spans:
            y, width = rows.index((s["rank"], s["lane"])), s["end_ms"] - s["start_ms"]
            ax.barh(y, width, left=s["start_ms"], height=0.7, color=KINDS[s["kind"]], edgecolor="white", lw=0.5)
            if width > 0.08 * end:
                ax.text(s["start_ms"] + width / 2, y, s["name"], ha="center", va="center", fontsize=7, clip_on=True)
        ax.set_yticks(range(len(rows)), [f"rank {r}, {lane}" for r, lane in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(name, fontsize=10, loc="left")
    axes[-1].set_xlabel("milliseconds from the common start")
    axes[0].legend(handles=[Patch(color=c, label=k) for k, c in KINDS.items()], loc="lower right",
                   bbox_to_anchor=(1, 1), ncols=3, fontsize=8, frameon=False)
    fig.suptitle(title)
    plot._note(fig, note)
    return fig
