"""Figures: where they are saved, how a notebook shows them, the scaling figures.

Figures are ``matplotlib.figure.Figure`` objects made without pyplot, so nothing here picks a GUI
backend; a notebook shows one with :func:`show`, which hands Jupyter the PNG itself (a bare
``Figure`` ending a cell shows as the text ``<Figure size 1000x400 with 2 Axes>``).
"""
from __future__ import annotations

import io
import math
import os
import sys
import textwrap
from pathlib import Path

from hpclab import backend


def save(fig, name: str, directory=None) -> Path:
    """Write ``fig`` as ``<directory>/<name>.png`` (default: ``$HPCLAB_FIGURES``, else ``build/figures``,
    made if missing) and return the path."""
    folder = Path(directory or os.environ.get("HPCLAB_FIGURES") or "build/figures")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name if str(name).endswith(".png") else f"{name}.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def png(fig) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def show(fig, name: str | None = None):
    """Show ``fig`` in the notebook as ``image/png`` display data, which JupyterLab, the executed copies
    and nbval keep whatever matplotlib backend is active; with ``name``, also save it. A pyplot figure is
    closed afterwards, so that the inline backend does not show it twice. Returns None, so that a cell
    ending in ``plot.show(...)`` shows the figure and nothing else."""
    from IPython import get_ipython
    from IPython.display import Image, display

    if get_ipython() is not None:
        display(Image(data=png(fig), format="png"))
    if "matplotlib.pyplot" in sys.modules and getattr(fig.canvas, "manager", None) is not None:
        sys.modules["matplotlib.pyplot"].close(fig)
    if name:
        save(fig, name)


def machine_note(records, weak: bool = False) -> str:
    """One sentence on what a sweep on this machine can show, from its records' ``ranks_per_gpu`` and
    ``backend`` (else the backend in use): on the simulator the machinery, not speed. ``weak``: a weak
    sweep, whose runs draw different work and so give different answers."""
    sharing = max((int(r.get("ranks_per_gpu") or 1) for r in records), default=1)
    name = next((r["backend"] for r in records if r.get("backend")), None) or backend.name()
    if name != "gpu":
        works = "every run checked" if weak else "same answers on 1, 2 and 4 ranks"
        return ("Here the ranks run on Numba's CUDA simulator, Python threads sharing this machine's few CPU "
                f"cores: the live curve shows that the machinery works ({works}), not GPU speed or scaling, "
                f"which only {'GPUs, one per rank,' if weak else 'the recorded GPU curves'} show.")
    if sharing > 1:
        return (f"Here {sharing if sharing > 2 else 'several'} ranks share one GPU and take turns on it: the live "
                "curve shows time sharing, not scaling, which needs one GPU per rank"
                + ("." if weak else " as in the recorded curves."))
    return "Here every rank has its own GPU: the live curve is real scaling" + (
        "." if weak else ", comparable with the recorded curves (mind the problem sizes in the labels).")


def _figure(width=10.0, height=4.0, panels=2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, panels)


def scaling_figure(summary: list[dict], mode: str, serial_fraction: float, title: str, note: str | None = None):
    """Speedup on log-log axes with the ideal line and the fitted law, and parallel efficiency
    (``summary``: ``Sweep.summary()`` rows with ranks, speedup, efficiency); ``note``: one sentence under it."""
    ranks = [r["ranks"] for r in summary]
    fig, (ax_s, ax_e) = _figure()
    span = [min(ranks), max(ranks)]
    ax_s.plot(span, span, "k--", lw=1, label="ideal")
    if not math.isnan(serial_fraction) and len(ranks) > 1:
        dense = [span[0] + (span[1] - span[0]) * i / 50 for i in range(51)]
        f = serial_fraction
        law = [1 / (f + (1 - f) / n) if mode == "strong" else n - f * (n - 1) for n in dense]
        name = "Amdahl" if mode == "strong" else "Gustafson"
        ax_s.plot(dense, law, ":", color="tab:gray", label=f"{name} fit, serial fraction {f:.4f}")
    ax_s.plot(ranks, [r["speedup"] for r in summary], "o-", color="tab:blue", label="measured")
    ax_s.set(xscale="log", yscale="log", xlabel="GPUs (MPI ranks)",
             ylabel="speedup T(1)/T(n)" if mode == "strong" else "scaled speedup n T(1)/T(n)")
    _rank_ticks(ax_s, ranks)
    _rank_ticks(ax_s, ranks, axis="y")
    ax_s.legend(fontsize=8)
    ax_e.axhline(1.0, color="k", ls="--", lw=1, label="ideal")
    ax_e.plot(ranks, [r["efficiency"] for r in summary], "o-", color="tab:blue", label="measured")
    ax_e.set(xscale="log", xlabel="GPUs (MPI ranks)", ylabel="parallel efficiency",
             ylim=(0, max(1.1, max(r["efficiency"] for r in summary) * 1.05)))
    _rank_ticks(ax_e, ranks)
    ax_e.legend(fontsize=8)
    fig.suptitle(title)
    _note(fig, note)
    return fig


def _rank_ticks(ax, ranks, axis="x"):
    from matplotlib.ticker import NullFormatter

    getattr(ax, f"set_{axis}ticks")(ranks, [f"{n:g}" for n in ranks])
    getattr(ax, f"{axis}axis").set_minor_formatter(NullFormatter())


def _note(fig, note: str | None) -> None:
    """One sentence under the figure (below an outside legend too: savefig's tight box takes it in)."""
    if note:
        fig.text(0.5, -0.01, textwrap.fill(note, 130), ha="center", va="top", fontsize=9, style="italic")


def beside_recorded(live, recorded: list, note: str | None = None, title: str | None = None):
    """A sweep measured here beside recorded GPU runs of the same program: speedup (left, against the
    ideal line; one-point curves have none) and work per second (right, where a GPU's rate and the
    simulator's sit decades apart). ``live``: a Curve (``recorded.from_sweep``), a list of them, or None;
    ``recorded``: ``recorded.curves(...)``; ``note`` defaults to :func:`machine_note` of the live records."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    lives = [] if live is None else list(live) if isinstance(live, (list, tuple)) else [live]
    if note is None and lives:
        note = machine_note([r for c in lives for r in c.records])
    # Recorded curves often lie on top of each other (near-ideal scaling): distinct markers keep each visible.
    markers = "s^vDP*X"
    styles = [(c, dict(marker="o", ls="-", lw=2.2, ms=7)) for c in lives]
    styles += [(c, dict(marker=markers[i % len(markers)], ls="--", lw=1.3, ms=8 - i % 4, alpha=0.9))
               for i, c in enumerate(recorded)]
    # Below the two panels, a caption row: one legend for both (inside either it would hide curves), the note.
    rows = math.ceil((len(styles) + 1) / 2)
    caption = 0.2 * rows + (0.5 if note else 0.0) + 0.15
    fig = Figure(figsize=(11.0, 4.0 + caption), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[4.0, caption])
    ax_s, ax_r, cap = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
    cap.axis("off")
    every = sorted({p["ranks"] for c, _ in styles for p in c.points})
    ax_s.plot([every[0], every[-1]], [every[0], every[-1]], color="k", ls=":", lw=1, label="ideal (speedup)")
    handles = [ax_s.get_lines()[0]]
    for i, (curve, style) in enumerate(styles):
        colour = f"C{i}"
        sp = curve.speedups()
        if sp:
            ax_s.plot(*zip(*sp), color=colour, **style)
        rated = [(p["ranks"], p["rate"]) for p in curve.points if p.get("rate")]
        if rated:
            ax_r.plot(*zip(*rated), color=colour, **style)
        handles.append(Line2D([], [], color=colour, label=curve.label, **style))
    units = sorted({c.unit for c, _ in styles})
    modes = {c.mode for c, _ in styles if c.speedups()}
    speedup = {frozenset({"strong"}): "speedup T(1) / T(n)", frozenset({"weak"}): "scaled speedup n T(1) / T(n)"}
    ax_s.set(xscale="log", yscale="log", xlabel="GPUs (MPI ranks)",
             ylabel=speedup.get(frozenset(modes), "speedup (weak scaling: scaled speedup)"), title="speedup")
    ax_r.set(xscale="log", yscale="log", xlabel="GPUs (MPI ranks)", ylabel=f"{' / '.join(units)} per second",
             title="throughput")
    for ax in (ax_s, ax_r):
        _rank_ticks(ax, every)
    low = min([every[0]] + [v for c, _ in styles for _, v in c.speedups()])
    _rank_ticks(ax_s, [2.0 ** k for k in range(math.floor(math.log2(low)), math.ceil(math.log2(every[-1])) + 1)],
                axis="y")
    cap.legend(handles=handles, loc="upper center", ncols=2, fontsize=8, frameon=False)
    if note:
        cap.text(0.5, 0.0, textwrap.fill(note, 140), ha="center", va="bottom", fontsize=9, style="italic",
                 transform=cap.transAxes)
    if title:
        fig.suptitle(title)
    return fig


def allreduce_figure(rows: list[dict], recorded: dict, note: str | None = None):
    """All-reduce time and bus bandwidth against message size, one colour per backend: measured here
    (solid; ``hpclab.comm.measure.run`` rows) and recorded (a line style per run; label ->
    ``recorded.allreduce(run)``, its raw NCCL left out)."""
    fig, (ax_t, ax_bw) = _figure(11.0, 4.4)
    colour = {name: f"C{i}" for i, name in enumerate(("mpi-host", "nccl", "mpi-cuda", "raw-nccl"))}
    for name in dict.fromkeys(r["backend"] for r in rows):
        mine = sorted((r for r in rows if r["backend"] == name and r["busbw_GBps"] > 0), key=lambda r: r["size_bytes"])
        sizes = [r["size_bytes"] for r in mine]
        style = dict(color=colour.get(name), marker="o", ls="-", lw=2.2, label=f"{name}, measured here")
        ax_t.loglog(sizes, [r["time_us"] for r in mine], **style)
        ax_bw.loglog(sizes, [r["busbw_GBps"] for r in mine], **style)
    for (label, by_backend), ls, marker in zip(recorded.items(), ("--", ":", "-."), ("s", "^", "v")):
        for name, points in by_backend.items():
            if name not in ("mpi-host", "mpi-cuda", "nccl"):
                continue
            sizes, seconds, busbw = zip(*points)
            style = dict(color=colour.get(name), marker=marker, ls=ls, lw=1.3, ms=4, label=f"{name}, {label}")
            ax_t.loglog(sizes, [t * 1e6 for t in seconds], **style)
            ax_bw.loglog(sizes, busbw, **style)
    ax_t.set(xlabel="message size (bytes)", ylabel="time per all-reduce (µs)", title="time")
    ax_bw.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)", title="bus bandwidth")
    ax_t.legend(fontsize=7)
    _note(fig, note)
    return fig
