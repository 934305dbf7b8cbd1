"""The rendered GPU runs in docs/rendered/ (expected outputs for the instructor) come from the current notebooks.

docs/render.py executes the notebooks and writes one HTML page per notebook, stamped with the device,
the date and the SHA-256 of the notebook's cell sources; a page whose notebook has changed since fails
here until it is rendered again. The tooling itself is tested by rendering notebook 00 on the simulator.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import nbformat
import pytest

from hpclab import backend

ROOT = Path(__file__).resolve().parent.parent
RENDERED = ROOT / "docs" / "rendered"
_spec = importlib.util.spec_from_file_location("render", ROOT / "docs" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


def test_rendered_gpu_runs_come_from_the_current_notebooks():
    if not list(RENDERED.glob("*.html")):
        pytest.skip("docs/rendered/ holds no rendered GPU runs yet: they are made on a GPU machine with "
                    "`python docs/render.py` (docs/instructor.md, 'Expected outputs')")
    assert render.stale(RENDERED) == []


def test_render_on_the_simulator_and_notice_a_changed_notebook(tmp_path):
    notebooks, executed = tmp_path / "notebooks", tmp_path / "executed"
    notebooks.mkdir(), executed.mkdir()
    shutil.copy(ROOT / "notebooks" / "00_setup.ipynb", notebooks)
    run = render.execute(notebooks, executed)                 # `hpclab workbook`, here
    assert run["passed"] and ("simulator" in run["device"]) == (backend.select() == "sim")
    [page] = render.render(executed, tmp_path / "rendered", run, notebooks)
    html = page.read_text()
    assert f"Executed on {run['device']}, {run['date']}" in html and "every rank ran its kernel" in html
    assert "<style" not in html.split("</head>")[0] and f'href="{render.CSS}"' in html
    assert ".jp-Notebook" in (page.parent / render.CSS).read_text()     # the template's styles, kept once
    assert render.rendered_hash(page) == render.lesson_hash("00_setup.ipynb", notebooks)
    assert render.stale(tmp_path / "rendered", notebooks) == []

    nb = nbformat.read(notebooks / "00_setup.ipynb", as_version=4)
    nb.cells[1].source += "\nOne more sentence."
    nbformat.write(nb, notebooks / "00_setup.ipynb")
    assert render.stale(tmp_path / "rendered", notebooks) == [
        "00_setup.html: notebooks/00_setup.ipynb has changed since it was rendered"]
    with pytest.raises(SystemExit, match="executed from another version"):
        render.render(executed, tmp_path / "again", run, notebooks)
    shutil.copy(ROOT / "notebooks" / "01_collectives.ipynb", notebooks)
    assert "notebooks/01_collectives.ipynb has no rendered page" in render.stale(tmp_path / "rendered", notebooks)


def test_a_progress_bar_shows_once_as_in_jupyterlab():
    """Each redraw of a %px progress bar is a stream output of its own; the page shows the last, in its place."""
    new = nbformat.v4.new_output
    bars = [new("stream", name="stdout", text=f"\r%px: {p:3d}%| {p // 25}/4") for p in (0, 25, 50, 75)]
    outputs = [*bars, new("stream", name="stdout", text="\r%px: 100%| 4/4\n[stdout:0] done\n"),
               new("stream", name="stderr", text="[stderr:1] a warning\n"),
               new("display_data", data={"text/plain": "<Figure>"}), new("stream", name="stdout", text="after\n")]
    shown = render.as_jupyterlab_shows(outputs)
    assert [(o.output_type, o.get("text")) for o in shown] == [
        ("stream", "%px: 100%| 4/4\n[stdout:0] done\n"), ("stream", "[stderr:1] a warning\n"),
        ("display_data", None), ("stream", "after\n")]
