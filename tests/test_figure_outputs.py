"""The rule conftest.py applies to every notebook cell nbval executes (and make run to every notebook it
executes): a figure must come out as an image."""
from __future__ import annotations

import nbformat

from hpclab.results import plot, recorded
from hpclab.cli.workbook import figure_problems, missing_image

FIGURE_CELL = "fig = Figure(figsize=(5, 3))\nax = fig.subplots()\nax.plot([1, 2])\n"


def test_a_bare_figure_shown_as_text_is_caught():
    outputs = [{"output_type": "execute_result", "data": {"text/plain": "<Figure size 1000x400 with 2 Axes>"}}]
    why = missing_image(FIGURE_CELL + "fig", outputs)
    assert why and "<Figure size 1000x400 with 2 Axes>" in why and "plot.show" in why


def test_a_figure_with_no_output_is_caught_and_one_with_an_image_passes():
    assert "no image/png" in missing_image(FIGURE_CELL, [])
    image = [{"output_type": "display_data", "data": {"image/png": "iVBOR...", "text/plain": "<IPython Image>"}}]
    assert missing_image(FIGURE_CELL + "plot.show(fig)", image) is None
    assert missing_image("print(1)  # no figure(s) here", []) is None
    assert missing_image("%%px\nfig = make_figure()", []) is None


def test_an_executed_notebook_names_the_cell_whose_figure_is_text():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# figure("),
                                         nbformat.v4.new_code_cell(FIGURE_CELL + "fig")])
    nb.cells[1].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "<Figure size 500x300 with 1 Axes>"})]
    assert figure_problems(nb) == [f"cell 1: {missing_image(nb.cells[1].source, nb.cells[1].outputs)}"]


def test_plot_show_sends_a_png_inside_ipython(monkeypatch):
    """plot.show hands IPython an Image with PNG data (what JupyterLab and nbclient keep)."""
    import IPython
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", shown.append)
    curve = recorded.curves("pi-mc")
    plot.show(plot.beside_recorded(None, curve, note="a note"))
    assert len(shown) == 1 and shown[0].format == "png" and shown[0].data[:8] == b"\x89PNG\r\n\x1a\n"


def test_make_run_where_engines_are_refused_says_why_without_a_traceback(tmp_path, monkeypatch, capsys):
    """make run on a Slurm login node: the refusal is the message, exit status 2."""
    from hpclab import cluster
    from hpclab.cli import workbook

    def refuse(n):
        raise cluster.ClusterError("no engines were started: this looks like a Slurm login node")

    monkeypatch.setattr(cluster, "start_shared", refuse)
    assert workbook.main(out=str(tmp_path / "build")) == 2
    assert "hpclab workbook: no engines were started: this looks like a Slurm login node" in capsys.readouterr().err
