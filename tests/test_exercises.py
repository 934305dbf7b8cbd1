import ast
import re
import subprocess
import sys

import nbformat
import pytest

from hpclab.cli import exercises

from .helpers import ROOT, env


def _python(source: str) -> str:
    """Cell source without IPython magics, for ast.parse."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())


def test_exercises_are_current():
    proc = subprocess.run([sys.executable, "-m", "hpclab", "exercises", "check"], capture_output=True,
                          text=True, timeout=60, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_strip_keeps_indentation_and_surroundings():
    src = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    return x + y\n    ### END SOLUTION\n"
    out = exercises.strip_solution(src)
    assert out == f"def f(x):\n    y = 1\n    {exercises.STUB}"
    ns = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError):
        ns["f"](1)


@pytest.mark.parametrize("src, problem", [
    ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n", "inside another"),
])
def test_broken_markers_are_reported(src, problem):
    with pytest.raises(exercises.MarkerError, match=problem):
        exercises.strip_solution(src)


def test_check_notices_a_hand_edited_exercise(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\nprint(answer)")])
    nbformat.write(nb, tmp_path / "solutions" / "99_demo.ipynb")
    assert exercises.check(tmp_path) == [f"{tmp_path / 'exercises' / '99_demo.ipynb'} is missing"]
    exercises.build(tmp_path)
    assert exercises.check(tmp_path) == []
    path = tmp_path / "exercises" / "99_demo.ipynb"
    path.write_text(path.read_text().replace("print(answer)", "print(answer + 1)"))
    assert "out of date" in exercises.check(tmp_path)[0]


def test_copy_gives_the_learner_a_working_copy_that_later_copies_keep(tmp_path, capsys):
    from hpclab import cli

    (tmp_path / "exercises").mkdir()
    for name in ("01_a.ipynb", "02_b.ipynb"):
        (tmp_path / "exercises" / name).write_text("generated")
    assert cli.main(["exercises", "copy", "--root", str(tmp_path)]) == 0
    mine = tmp_path / exercises.MY_WORK / "01_a.ipynb"
    assert mine.read_text() == "generated"
    mine.write_text("my answer")
    (tmp_path / "exercises" / "01_a.ipynb").write_text("regenerated")
    (tmp_path / "exercises" / "03_c.ipynb").write_text("new")
    assert cli.main(["exercises", "copy", "--root", str(tmp_path)]) == 0
    assert mine.read_text() == "my answer"                       # never overwritten
    assert (tmp_path / exercises.MY_WORK / "03_c.ipynb").read_text() == "new"
    out = capsys.readouterr().out
    assert f"kept yours: {mine}" in out and "not in git" in out
    assert "/my-work/" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.name)
def test_every_solution_has_an_exercise_and_all_cells_parse(path):
    exercise = nbformat.read(ROOT / "exercises" / path.name, as_version=4)
    stubs = 0
    for cell in exercise.cells:
        if cell.cell_type == "code":
            ast.parse(_python(cell.source))
            stubs += cell.source.count("NotImplementedError")
    assert stubs >= 1
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            ast.parse(_python(cell.source))


def test_committed_notebooks_carry_no_outputs():
    paths = [p for d in ("notebooks", "solutions", "exercises") for p in sorted((ROOT / d).glob("*.ipynb"))]
    assert paths
    for path in paths:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"


def test_notebooks_are_numbered_in_order():
    names = [p.name for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    assert all(re.match(r"\d\d_[a-z0-9_]+\.ipynb$", n) for n in names)
    assert names[:2] == ["00_setup.ipynb", "01_collectives.ipynb"]


def test_missing_dependency_names_the_module_and_the_environment(monkeypatch, capsys):
    """A Python without nbformat gets told which module and how to set up, not a traceback."""
    import hpclab
    from hpclab import cli

    monkeypatch.setitem(sys.modules, "nbformat", None)     # import nbformat now fails
    monkeypatch.delitem(sys.modules, "hpclab.cli.exercises")   # so the command imports it afresh
    monkeypatch.delattr(cli, "exercises")
    assert cli.main(["exercises", "check", "--root", str(ROOT)]) == 1
    err = capsys.readouterr().err
    assert "no module 'nbformat'" in err and "make setup" in err and sys.executable in err


# ---------------------------------------------------------------- one source per cell: solutions linked to lessons

def _lesson_and_solution(root, ids=True):
    """notebooks/99_demo.ipynb (a lesson) and solutions/99_demo.ipynb, whose first two cells copy the lesson's."""
    for folder in ("notebooks", "solutions", "exercises"):
        (root / folder).mkdir(exist_ok=True)
    v4 = nbformat.v4
    lesson = v4.new_notebook(cells=[v4.new_markdown_cell("# Demo"), v4.new_code_cell("import math\nx = 2"),
                                    v4.new_code_cell("print(x)"), v4.new_code_cell("print(x)")])
    if not ids:                                     # as nbformat 4.4 wrote it: no cell ids
        lesson.nbformat_minor = 4
        for cell in lesson.cells:
            del cell["id"]
    solution = v4.new_notebook(cells=[v4.new_markdown_cell("# Demo"), v4.new_code_cell("import math\nx = 2"),
                                      v4.new_code_cell("### BEGIN SOLUTION\ny = math.sqrt(x)\n### END SOLUTION"),
                                      v4.new_code_cell("print(x)"), v4.new_code_cell("print(x)"),
                                      v4.new_code_cell("print(y)"), v4.new_code_cell("")])
    (root / "notebooks" / "99_demo.ipynb").write_text(nbformat.writes(lesson) + "\n")
    (root / "solutions" / "99_demo.ipynb").write_text(nbformat.writes(solution) + "\n")
    return root / "notebooks" / "99_demo.ipynb", root / "solutions" / "99_demo.ipynb"


def test_link_marks_identical_cells_and_gives_the_lesson_cell_ids(tmp_path):
    lesson_path, solution_path = _lesson_and_solution(tmp_path, ids=False)
    before = (lesson_path.read_text(), solution_path.read_text())
    found = exercises.link(solution_path, tmp_path, write=False)               # dry run: counts, writes nothing
    assert [(i, n) for i, _, n in found] == [(0, 1), (1, 2), (3, 1), (4, 1)]
    assert (lesson_path.read_text(), solution_path.read_text()) == before
    found = exercises.link(solution_path, tmp_path)
    lesson, solution = nbformat.read(lesson_path, as_version=4), nbformat.read(solution_path, as_version=4)
    assert lesson.nbformat_minor == 5 and all(cell.get("id") for cell in lesson.cells)
    links = [exercises.source_of(cell) for cell in solution.cells]
    assert links == [lesson.cells[0].id, lesson.cells[1].id, None, lesson.cells[2].id, lesson.cells[3].id, None, None]
    assert exercises.link(solution_path, tmp_path) == []                     # linking again finds nothing new
    assert exercises.build(tmp_path) == [tmp_path / "exercises" / "99_demo.ipynb"]
    assert exercises.check(tmp_path) == []


def test_build_fills_linked_cells_from_the_lesson_and_check_catches_a_copy_edited_by_hand(tmp_path):
    lesson_path, solution_path = _lesson_and_solution(tmp_path)
    exercises.link(solution_path, tmp_path)
    exercises.build(tmp_path)
    assert exercises.check(tmp_path) == []
    # a copy edited by hand in solutions/: check fails and names the cell; build puts the lesson's source back
    solution_path.write_text(solution_path.read_text().replace('"import math\\n",', '"import math  # edited\\n",'))
    problems = exercises.check(tmp_path)
    assert problems[0].startswith(f"{solution_path} cell 1 differs from cell ")
    assert "edit the lesson notebook, then build" in problems[0]
    assert exercises.build(tmp_path) == [solution_path]          # the exercise never held the edit
    assert "# edited" not in solution_path.read_text() and exercises.check(tmp_path) == []
    # the lesson changes: the solution and the exercise are out of date until build carries the change over
    lesson_path.write_text(lesson_path.read_text().replace('"x = 2"', '"x = 3"'))
    assert any("cell 1 differs" in p for p in exercises.check(tmp_path))
    assert exercises.build(tmp_path) == [solution_path, tmp_path / "exercises" / "99_demo.ipynb"]
    assert "x = 3" in (tmp_path / "exercises" / "99_demo.ipynb").read_text() and exercises.check(tmp_path) == []


def test_a_link_to_a_missing_lesson_cell_says_what_to_do(tmp_path, capsys):
    from hpclab import cli

    lesson_path, solution_path = _lesson_and_solution(tmp_path)
    exercises.link(solution_path, tmp_path)
    lesson = nbformat.read(lesson_path, as_version=4)
    gone = lesson.cells.pop(1).id
    lesson_path.write_text(nbformat.writes(lesson) + "\n")
    assert cli.main(["exercises", "check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"cell 1 is a copy of cell {gone!r}" in err and "link it again (hpclab exercises link)" in err


def test_link_command_counts_cells_and_lines(tmp_path, capsys):
    from hpclab import cli

    _, solution_path = _lesson_and_solution(tmp_path)
    assert cli.main(["exercises", "link", "--root", str(tmp_path), "--dry-run", str(solution_path)]) == 0
    out = capsys.readouterr().out
    assert "would link 4 of 7 cells (5 of 9 lines)" in out and "cells 0, 1, 3, 4" in out
    assert exercises.source_of(nbformat.read(solution_path, as_version=4).cells[0]) is None
    assert cli.main(["exercises", "link", "--root", str(tmp_path)]) == 0
    assert "linked 4 of 7 cells, 5 of 9 lines; now `hpclab exercises build`" in capsys.readouterr().out


def _shown_sources(notebook) -> list[str]:
    """The dotted names a notebook prints with inspect.getsource, directly or through a for loop
    over a tuple of them, its `from X import m` resolved (m.k -> X.m.k)."""
    cells = [ast.parse(_python(c.source)) for c in notebook.cells if c.cell_type == "code"]
    modules = {a.asname or a.name: f"{node.module}.{a.name}" for tree in cells for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) for a in node.names}
    return [name for tree in cells for name in _printed(tree, modules)]


def _printed(tree, modules: dict) -> list[str]:
    loops = {node.target.id: node.iter.elts for node in ast.walk(tree)
             if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple)}
    shown = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("getsource"):
            arg = node.args[0]
            for target in loops.get(arg.id, [arg]) if isinstance(arg, ast.Name) else [arg]:
                head, _, rest = ast.unparse(target).partition(".")
                shown.append(f"{modules.get(head, head)}.{rest}".rstrip("."))
    return shown


def test_every_kernel_a_notebook_prints_is_plain():
    """What a notebook shows of the library is short and has no simulator branch."""
    import importlib
    import inspect

    shown = [name for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
             for name in _shown_sources(nbformat.read(path, as_version=4))]
    assert len(shown) >= 6, shown            # 02, 03, 04 and 06 show their kernels
    for name in shown:
        module, _, attrs = name.partition(".")
        obj = importlib.import_module(module)
        for attr in attrs.split("."):       # a submodule not imported yet is imported here
            obj = getattr(obj, attr) if hasattr(obj, attr) else importlib.import_module(f"{obj.__name__}.{attr}")
        source = inspect.getsource(getattr(obj, "py_func", obj))
        assert source.count("\n") <= 60, f"{name} is {source.count(chr(10))} lines: too long to read in a cell"
        assert "is_simulator" not in source and "backend." not in source, f"{name} branches on the backend"
