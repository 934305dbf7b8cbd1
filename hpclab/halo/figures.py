"""Pictures for the halo-exchange notebook: bands per rank, and scaling with its time split.

Built as ``matplotlib.figure.Figure`` objects without pyplot (see :mod:`hpclab.results.plot`):
a notebook shows them with ``hpclab.results.plot.show``.
"""
from __future__ import annotations

from hpclab.halo.geometry import plan_bands


def bands_figure(height: int, kernel: int, stride: int, pad: int, size: int, title: str = ""):
    """Input rows (left axis) per rank: own rows, halo from above/below, and the output band."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 + 1.5 * size, 4.2))
    ax = fig.subplots()
    colours = colormaps["tab10"]
    for p in plan_bands(height, kernel, stride, pad, size):
        x = p.rank
        ax.bar(x - 0.18, p.own[1] - p.own[0], bottom=p.own[0], width=0.32, color=colours(p.rank), alpha=0.35,
               label="own input rows" if x == 0 else None)
        ax.bar(x + 0.18, p.have[1] - p.have[0], bottom=p.have[0], width=0.32, color=colours(p.rank),
               label="input rows read" if x == 0 else None)
        for seg in (*p.above, *p.below):
            ax.bar(x + 0.18, seg.rows, bottom=seg.start, width=0.32, color="none", edgecolor="black",
                   hatch="///", label="halo (from a neighbour)" if x == 0 and seg is (*p.above, *p.below)[0] else None)
            ax.annotate(f"{seg.rows} from r{seg.src}", (x + 0.36, seg.start + seg.rows / 2), fontsize=7, va="center")
        ax.text(x, -0.04 * height, f"out [{p.out_rows[0]},{p.out_rows[1]})", ha="center", va="top", fontsize=7)
    ax.set_ylim(height * 1.02, -0.1 * height)
    ax.set_xticks(range(size), [f"rank {r}" for r in range(size)])
    ax.set(ylabel="input row", title=title or f"{height} rows, kernel {kernel}, stride {stride}, pad {pad}, "
                                              f"{size} ranks")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    return fig


def scaling_figure(points: list[dict], title: str = ""):
    """points: dicts with mode, ranks, wall_s and phase seconds; strong and weak side by side."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    for ax, mode in zip(axes, ("strong", "weak")):
        rows = sorted((p for p in points if p["mode"] == mode), key=lambda p: p["ranks"])
        if not rows:
            continue
        ranks = [p["ranks"] for p in rows]
        bottom = [0.0] * len(rows)
        for phase, colour in (("compute", "tab:blue"), ("halo", "tab:orange"), ("transfer", "tab:green")):
            vals = [p.get(phase, 0.0) for p in rows]
            ax.bar([str(r) for r in ranks], vals, bottom=bottom, color=colour, label=phase)
            bottom = [b + v for b, v in zip(bottom, vals)]
        t1 = rows[0]["wall_s"] * (rows[0]["ranks"] if mode == "strong" else 1)
        ideal = [t1 / r if mode == "strong" else t1 for r in ranks]
        ax.plot([str(r) for r in ranks], ideal, "k--", label="ideal")
        ax.set_ylim(0, 1.35 * max(bottom + ideal))        # the whole bars, and room for the legend
        ax.set(xlabel="ranks", ylabel="seconds (max over ranks)", title=f"{mode} scaling")
        ax.legend(fontsize=8, ncols=4, loc="upper center")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
