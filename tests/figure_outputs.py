"""Does a notebook cell that makes a figure show it as an image? (Used by conftest.py on every cell nbval runs.)

A cell makes a figure when its code calls something named ``...figure(`` or
``...subplots(`` (``Figure(...)``, ``plot.beside_recorded``'s helpers, ``bands_figure``,
``plt.subplots``), or when an output is matplotlib's text stand-in ``<Figure size ...>``.
Such a cell must leave an ``image/png`` output: a figure shown as text teaches nothing.
"""
from __future__ import annotations

import re

MAKES_FIGURE = re.compile(r"(figure|subplots)\s*\(", re.IGNORECASE)
TEXT_STAND_IN = re.compile(r"<(matplotlib\.figure\.)?Figure size \d+x\d+ with \d+ Axes>")


def _code(source: str) -> str:
    """The cell's code without comments and without %%px cells' (which run on the engines)."""
    if source.lstrip().startswith("%%px"):
        return ""
    return "\n".join(line.split("#", 1)[0] for line in source.splitlines())


def missing_image(source: str, outputs: list[dict]) -> str | None:
    """None when the cell is fine, else a sentence saying what is wrong."""
    texts = [out.get("data", {}).get("text/plain", "") for out in outputs] + [out.get("text", "") for out in outputs]
    stand_in = next((m.group(0) for t in texts if (m := TEXT_STAND_IN.search("".join(t)))), None)
    images = sum("image/png" in out.get("data", {}) for out in outputs)
    if stand_in:
        return (f"shows a figure as the text {stand_in!r}, not as an image: end with "
                "hpclab.plot.show(fig) instead of a bare figure")
    if MAKES_FIGURE.search(_code(source)) and not images:
        return "makes a figure but leaves no image/png output: show it with hpclab.plot.show(fig)"
    return None
