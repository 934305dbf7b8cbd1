"""Every unfilled exercise stops the learner with its message, raised from host code, on every backend.

numba-cuda reports an exception raised inside a kernel only when the kernel was compiled with debug=True: on a
GPU a stub left inside a kernel would let the thread return and the check judge zeros. So an exercise launches
its kernel through ``hpclab.stub.written``, which finds the stub in the kernel's code and raises on the host.
Here each exercise notebook runs unfilled, its kernel as on a login node (no GPU) and its engines as a shared
cluster started beside it, up to its last part: every part must end with the message, and no check may pass.
On the simulator that is the exercises whose stubs lie inside a kernel; on a GPU, every exercise.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap

import nbformat
import pytest

from hpclab import backend
from hpclab.stub import MESSAGE

from .helpers import ROOT, env
from .test_cluster import RUNNER, _text

EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
pytestmark = pytest.mark.notebooks


def _python(source: str) -> str:
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())


def _kernel_stubs(source: str) -> list[str]:
    """The @cuda.jit functions of a cell that still raise the exercise's NotImplementedError."""
    names = []
    for node in ast.walk(ast.parse(_python(source))):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list) \
                and MESSAGE in ast.unparse(node):
            names.append(node.name)
    return names


def _stub_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and MESSAGE in c.source]


def test_every_kernel_with_a_stub_is_launched_through_written():
    """What the generator writes into a kernel must reach the learner on a GPU too: its cell launches it through
    written(), which raises on the host (a kernel's own raise is dropped without debug=True)."""
    found = 0
    for path in EXERCISES:
        for cell in nbformat.read(path, as_version=4).cells:
            for name in _kernel_stubs(cell.source) if cell.cell_type == "code" else ():
                found += 1
                assert f"written({name})" in cell.source, f"{path.name}: launch {name} through written({name})"
    assert found >= 3, found        # 02, 03 and 04 have their learner write a kernel body


def _runs_here(path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return backend.name() == "gpu" or any(_kernel_stubs(c.source) for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", [p for p in EXERCISES if _runs_here(p)], ids=lambda p: p.name)
def test_an_unfilled_exercise_says_what_to_write_in_every_part(path, tmp_path):
    exercise, solution = (nbformat.read(p, as_version=4) for p in (path, ROOT / "solutions" / path.name))
    stubs = _stub_cells(exercise)
    # Each part unfilled, then the check after it (which must not pass), then the part as the solution has it,
    # so that the next part finds what this one defines; up to the last part's check, then the engines go back.
    cells, parts = [], []
    for i in range(stubs[-1] + 2):
        cells.append(exercise.cells[i])
        if i in stubs:
            parts.append((len(cells) - 1, len(cells)))
        if i - 1 in stubs:
            cells.append(solution.cells[i - 1])
    exercise.cells = cells + [nbformat.v4.new_code_cell("session.close()")]
    for cell in exercise.cells:
        cell.metadata["timeout"] = 600
    book, out = tmp_path / path.name, tmp_path / f"out_{path.name}"
    nbformat.write(exercise, book)
    e = env(IPYTHONDIR=str(tmp_path / "ipython"))
    start = subprocess.run([sys.executable, "-m", "hpclab", "cluster", "start", "-n", "4"], capture_output=True,
                           text=True, timeout=300, env=e, cwd=ROOT)
    assert start.returncode == 0, start.stdout + start.stderr
    try:   # the notebook's kernel as on a login node: no GPU, no GPU work (the engines above have the GPUs)
        run = subprocess.run([sys.executable, "-c", RUNNER, str(book), str(out), str(tmp_path)], capture_output=True,
                             text=True, timeout=1200, env={**e, "HPCLAB_LOGIN_NODE": "1", "CUDA_VISIBLE_DEVICES": ""},
                             cwd=ROOT)
        assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        subprocess.run([sys.executable, "-m", "hpclab", "cluster", "stop", "--all"], capture_output=True, timeout=120,
                       env=e, cwd=ROOT)
    cells = nbformat.read(out, as_version=4).cells
    for stub, check in parts:
        said = _text(cells[stub]) + _text(cells[check])    # (a part that defines a function fails where it is called)
        assert "NotImplementedError" in said and MESSAGE in said, f"{path.name} cell {stub}:\n{said[-2000:]}"
        for name in _kernel_stubs(cells[stub].source):       # raised by written() on the host, naming the kernel
            assert f"{name} still holds the line that raises this" in said, f"{path.name} cell {stub}:\n{said[-2000:]}"
        verdict = _text(cells[check])
        assert not re.search(r"^correct: ", verdict, re.M), f"{path.name}: the check after an unfilled part passed"
    assert "GPU work belongs on the engines" not in "\n".join(_text(c) for c in cells), textwrap.shorten(
        "\n".join(_text(c) for c in cells), 3000)
