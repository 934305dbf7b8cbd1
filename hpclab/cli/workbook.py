"""Execute every notebook on MPI engines, headless (``make run`` / ``hpclab workbook``).

Starts the profile's shared cluster once (or uses the one running), runs the notebooks in order with
nbclient (each claims the engines with ``cluster.connect`` and gives them back), writes executed copies
into ``build/`` and figures into ``build/figures/``, prints a summary, and stops the engines only if it
started them. A notebook passes when every cell ran and every figure came out as an image.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from traitlets.config import Config


MAKES_FIGURE = re.compile(r"(figure|subplots)\s*\(", re.IGNORECASE)
TEXT_STAND_IN = re.compile(r"<(matplotlib\.figure\.)?Figure size \d+x\d+ with \d+ Axes>")
ENCRYPTED = Config(KernelManager={"transport_encryption": "auto"})  # CurveZMQ: ipykernel 7 warns on plain TCP


def missing_image(source: str, outputs: list[dict]) -> str | None:
    """Why a cell's figure is not shown as an image, or None when it is (or the cell makes none). A cell
    makes a figure when its code calls ``...figure(`` or ``...subplots(``, or an output is matplotlib's text
    stand-in ``<Figure size ...>``; it must leave an ``image/png`` output. ``%%px`` cells are not judged."""
    if source.lstrip().startswith("%%px"):
        return None
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines())
    texts = ["".join(out.get("data", {}).get("text/plain", "")) + "".join(out.get("text", "")) for out in outputs]
    stand_in = next((m.group(0) for t in texts if (m := TEXT_STAND_IN.search(t))), None)
    if stand_in:
        return (f"shows a figure as the text {stand_in!r}, not as an image: end with "
                "hpclab.results.plot.show(fig) instead of a bare figure")
    if MAKES_FIGURE.search(code) and not any("image/png" in out.get("data", {}) for out in outputs):
        return "makes a figure but leaves no image/png output: show it with hpclab.results.plot.show(fig)"
    return None


def figure_problems(nb) -> list[str]:
    """'cell N: why' for each code cell of an executed notebook whose figure is not an image."""
    return [f"cell {i}: {why}" for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and (why := missing_image(cell.source, cell.get("outputs", [])))]


def execute(path: Path, out_dir: Path, timeout: int) -> tuple[bool, float, str]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", config=ENCRYPTED,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    ok, why = True, ""
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        ename = getattr(exc, "ename", None)       # a cell's error: its name and value, as the cell shows them
        ok, why = False, (f"{ename}: {exc.evalue}" if ename else str(exc).splitlines()[0])[:200]
    seconds = time.perf_counter() - t0
    nbformat.write(nb, out_dir / path.name)
    if ok and (problems := figure_problems(nb)):
        ok, why = False, "; ".join(problems)[:300]
    return ok, seconds, why


def main(notebooks: str = "notebooks", out: str = "build", engines: int = 4, timeout: int = 1200,
         login_node: bool = False) -> int:
    from hpclab import backend, cluster

    paths = sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        print(f"no notebooks in {notebooks}/")
        return 1
    out_dir = Path(out)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    os.environ["HPCLAB_FIGURES"] = str((out_dir / "figures").resolve())
    choice = backend.select()
    print(f"hpclab workbook: {len(paths)} notebooks on {engines} MPI engines, "
          f"backend: {backend.describe(choice)}")
    try:
        shared = cluster.start_shared(n=engines)
    except cluster.ClusterError as exc:
        print(f"hpclab workbook: {exc}", file=sys.stderr)
        return 2
    if login_node:   # the engines, started above, keep the GPUs; the kernels started below see none
        os.environ.update(HPCLAB_LOGIN_NODE="1", CUDA_VISIBLE_DEVICES="")
        print("hpclab workbook: each notebook's kernel runs as on a login node: no GPU in its own process")
    rows = []
    try:
        for path in paths:
            print(f"  running {path.name} ...", flush=True)
            rows.append((path.name, *execute(path, out_dir, timeout)))
    finally:
        shared.stop()
    width = max(len(r[0]) for r in rows)
    print(f"\n{'notebook':<{width}}  backend  seconds  result")
    for name, ok, seconds, why in rows:
        print(f"{name:<{width}}  {choice:<7}  {seconds:7.1f}  {'pass' if ok else 'FAIL  ' + why}")
    figures = sorted((out_dir / "figures").glob("*.png"))
    print(f"\nexecuted notebooks in {out_dir}/, {len(figures)} figure(s) in {out_dir / 'figures'}/")
    return 0 if all(r[1] for r in rows) else 1
