"""Figures: where they are saved, the scaling figure, and this machine vs the workshop's A100.

Figures are built as ``matplotlib.figure.Figure`` objects without pyplot, so
nothing here picks a GUI backend: the command line writes PNGs, and a
notebook shows the returned figure as the last expression of a cell.
"""
from __future__ import annotations

import os
from pathlib import Path

FIGURES_ENV = "HPCLAB_FIGURES"


def figures_dir() -> Path:
    """``$HPCLAB_FIGURES``, else ``build/figures`` (created)."""
    path = Path(os.environ.get(FIGURES_ENV) or "build/figures")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save(fig, name: str, directory=None, dpi: int = 120) -> Path:
    """Write ``fig`` as ``<directory>/<name>.png`` and return the path.

    ``directory`` defaults to :func:`figures_dir`; missing folders are created.
    """
    folder = Path(directory) if directory is not None else figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name if str(name).endswith(".png") else f"{name}.png")
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def _figure(width=10.0, height=4.0, panels=2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, panels)


def scaling_figure(summary: list[dict], mode: str = "strong", serial_fraction: float | None = None,
                   title: str | None = None, label: str = "measured"):
    """Speedup on log-log axes with the ideal line (and the fitted law), and parallel efficiency.

    ``summary``: rows with ranks, speedup, efficiency (``Sweep.summary()``).
    """
    import math

    ranks = [r["ranks"] for r in summary]
    fig, (ax_s, ax_e) = _figure()
    span = [min(ranks), max(ranks)]
    ax_s.plot(span, span, "k--", lw=1, label="ideal")
    if serial_fraction is not None and not math.isnan(serial_fraction) and len(ranks) > 1:
        dense = [span[0] + (span[1] - span[0]) * i / 50 for i in range(51)]
        if mode == "strong":
            law = [1 / (serial_fraction + (1 - serial_fraction) / n) for n in dense]
            name = "Amdahl"
        else:
            law = [n - serial_fraction * (n - 1) for n in dense]
            name = "Gustafson"
        ax_s.plot(dense, law, ":", color="tab:gray", label=f"{name} fit, serial fraction {serial_fraction:.4f}")
    ax_s.plot(ranks, [r["speedup"] for r in summary], "o-", color="tab:blue", label=label)
    ax_s.set(xscale="log", yscale="log", xlabel="GPUs (MPI ranks)",
             ylabel="speedup T(1)/T(n)" if mode == "strong" else "scaled speedup n T(1)/T(n)")
    _rank_ticks(ax_s, ranks)
    _rank_ticks(ax_s, ranks, axis="y")
    ax_s.legend(fontsize=8)
    ax_e.axhline(1.0, color="k", ls="--", lw=1, label="ideal")
    ax_e.plot(ranks, [r["efficiency"] for r in summary], "o-", color="tab:blue", label=label)
    ax_e.set(xscale="log", xlabel="GPUs (MPI ranks)", ylabel="parallel efficiency",
             ylim=(0, max(1.1, max(r["efficiency"] for r in summary) * 1.05)))
    _rank_ticks(ax_e, ranks)
    ax_e.legend(fontsize=8)
    fig.suptitle(title or f"{mode} scaling")
    return fig


def _rank_ticks(ax, ranks, axis="x"):
    from matplotlib.ticker import NullFormatter

    getattr(ax, f"set_{axis}ticks")(ranks)
    getattr(ax, f"set_{axis}ticklabels")([str(n) for n in ranks])
    getattr(ax, f"{axis}axis").set_minor_formatter(NullFormatter())


def compare_figure(summary: list[dict], reference: list[dict], this_label: str = "this machine",
                   reference_label: str = "workshop A100", unit: str = "samples", title: str | None = None):
    """This machine vs a reference side by side: throughput (work/s) and parallel efficiency.

    Throughput rather than wall time, because the two runs may use different
    problem sizes. Rows need ranks, work, median_wall_s, efficiency.
    """
    fig, (ax_t, ax_e) = _figure()
    for rows, label, style in ((summary, this_label, "o-"), (reference, reference_label, "s--")):
        ranks = [r["ranks"] for r in rows]
        ax_t.plot(ranks, [r["work"] / r["median_wall_s"] for r in rows], style, label=label)
        ax_e.plot(ranks, [r["efficiency"] for r in rows], style, label=label)
    every = sorted({r["ranks"] for r in [*summary, *reference]})
    ax_t.set(xscale="log", yscale="log", xlabel="GPUs (MPI ranks)", ylabel=f"{unit} per second")
    ax_e.axhline(1.0, color="k", ls="--", lw=1)
    ax_e.set(xscale="log", xlabel="GPUs (MPI ranks)", ylabel="parallel efficiency", ylim=(0, 1.1))
    for ax in (ax_t, ax_e):
        _rank_ticks(ax, every)
        ax.legend(fontsize=8)
    fig.suptitle(title or f"{this_label} vs {reference_label}")
    return fig
