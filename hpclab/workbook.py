"""Execute every notebook on MPI engines, headless (``make run`` / ``hpclab workbook``).

Starts the profile's shared cluster of MPI engines once (or uses the one already
running), runs the notebooks in order with nbclient (each claims the engines with
``cluster.connect`` and gives them back with ``session.close``), writes executed
copies into ``build/`` and figures into ``build/figures/``, prints a summary, and
stops the engines only if it started them.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError


def _first_error(nb) -> str:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"{out.get('ename')}: {out.get('evalue')}"[:200]
    return ""


def execute(path: Path, out_dir: Path, timeout: int) -> tuple[bool, float, str]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    ok, why = True, ""
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        ok, why = False, _first_error(nb) or str(exc).splitlines()[0][:200]
    seconds = time.perf_counter() - t0
    nbformat.write(nb, out_dir / path.name)
    return ok, seconds, why


def main(notebooks: str = "notebooks", out: str = "build", engines: int = 4, timeout: int = 1200) -> int:
    from . import backend, cluster

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
    shared = cluster.start_shared(n=engines)
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
