"""Build ``exercises/`` from ``solutions/``, and check that it is current.

In a solution notebook, the answer sits between two marker lines inside a
code cell::

    ### BEGIN SOLUTION
    ... the answer ...
    ### END SOLUTION

The exercise keeps everything else and puts, at the answer's indentation, a
line that raises ``NotImplementedError`` telling the learner what to write.
Outputs are dropped. ``exercises/`` is generated (``build`` rewrites it), so a
learner works on a copy: ``copy`` puts the exercises into ``my-work/`` (ignored
by git) and never overwrites a notebook already there.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat

from hpclab.options import UsageError

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("exercise: write this part (see the instructions above)")'


class MarkerError(ValueError):
    pass


class NotebookError(ValueError):
    """A notebook that cannot be read, or an output that cannot be written."""


def strip_solution(source: str, where: str = "cell") -> str:
    """Replace each marked answer with a stub at the same indentation."""
    out, inside, indent = [], False, ""
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise MarkerError(f"{where}, line {number}: {BEGIN} inside another solution")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{STUB}")
        elif stripped == END:
            if not inside:
                raise MarkerError(f"{where}, line {number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"{where}: {BEGIN} is never closed by {END}")
    return "\n".join(out)


def exercise_notebook(solution: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    nb = nbformat.from_dict(solution)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.source = strip_solution(cell.source, f"{name} cell {index}")
            cell.outputs, cell.execution_count = [], None
    return nb


def _pairs(root: Path):
    for solution in sorted((root / "solutions").glob("*.ipynb")):
        yield solution, root / "exercises" / solution.name


def _read(path: Path) -> nbformat.NotebookNode:
    try:
        return nbformat.read(path, as_version=4)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, nbformat.reader.NotJSONError,
            nbformat.ValidationError, KeyError, AttributeError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotebookError(f"{path} is not a readable notebook ({type(exc).__name__}: {reason[:200]}); "
                            "restore it from git (git checkout -- FILE) or fix its JSON") from None


def render(solution: Path) -> str:
    nb = exercise_notebook(_read(solution), solution.name)
    return nbformat.writes(nb) + "\n"


def _folder(path: Path) -> Path:
    """exercises/, made if missing; a file in its place is an error that says so."""
    if path.exists() and not path.is_dir():
        raise NotebookError(f"{path} is a file, but exercises are written into a folder of that name; "
                            "move the file away")
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise NotebookError(f"cannot make the folder {path}: {exc.strerror or exc}") from None
    return path


def _write(path: Path, text: str) -> None:
    if path.is_dir():
        raise NotebookError(f"{path} is a folder where the exercise notebook goes; move it away")
    try:
        path.write_text(text)
    except OSError as exc:
        raise NotebookError(f"cannot write {path}: {exc.strerror or exc}") from None


def check_root(root: Path, source: str = "solutions") -> Path:
    """The project root given by --root must hold ``source``/ (solutions/ to build or check,
    exercises/ to copy): say so before doing anything."""
    if not root.is_dir():
        raise UsageError(f"hpclab exercises: error: --root {root}: no such folder; give the project root "
                         "(the folder with solutions/ and exercises/)")
    if not (root / source).is_dir():
        raise UsageError(f"hpclab exercises: error: --root {root} has no {source}/ folder; give the project "
                         "root (the folder with solutions/ and exercises/)")
    if not any((root / source).glob("*.ipynb")):
        raise UsageError(f"hpclab exercises: error: --root {root}: {source}/ holds no notebooks")
    return root


def build(root: Path) -> list[Path]:
    _folder(root / "exercises")
    written = []
    for solution, exercise in _pairs(root):
        text = render(solution)
        if not exercise.exists() or exercise.is_dir() or exercise.read_text() != text:
            _write(exercise, text)
            written.append(exercise)
    known = {s.name for s, _ in _pairs(root)}
    for stale in (root / "exercises").glob("*.ipynb"):
        if stale.name not in known:
            stale.unlink()
            written.append(stale)
    return written


def check(root: Path) -> list[str]:
    """Problems that make exercises/ differ from what build() would write."""
    problems = []
    for solution, exercise in _pairs(root):
        expected = render(solution)           # an unreadable solution stops the check: nothing to compare
        if BEGIN not in solution.read_text():
            problems.append(f"{solution} has no {BEGIN} marker: nothing for the learner to write")
        if not exercise.is_file():
            problems.append(f"{exercise} is missing")
        elif exercise.read_text() != expected:
            problems.append(f"{exercise} is out of date with {solution}")
    known = {s.name for s, _ in _pairs(root)}
    if (root / "exercises").exists() and not (root / "exercises").is_dir():
        problems.append(f"{root / 'exercises'} is a file, not the exercises folder")
    else:
        problems += [f"{p} has no solution" for p in (root / "exercises").glob("*.ipynb")
                     if p.name not in known]
    return problems


MY_WORK = "my-work"


def copy(root: Path, dest: str = MY_WORK) -> list[tuple[Path, bool]]:
    """Copy each exercise into ``dest`` unless a notebook of that name is there: (path, copied)."""
    folder = root / dest
    folder.mkdir(exist_ok=True)
    done = []
    for exercise in sorted((root / "exercises").glob("*.ipynb")):
        target = folder / exercise.name
        copied = not target.exists()
        if copied:
            target.write_bytes(exercise.read_bytes())
        done.append((target, copied))
    return done


def main(action: str, root: str = ".") -> int:
    path = check_root(Path(root), "exercises" if action == "copy" else "solutions")  # UsageError: the hpclab command says it and exits with 2
    try:
        if action == "copy":
            for target, copied in copy(path):
                print(f"{'copied' if copied else 'kept yours'}: {target}")
            print(f"work in {MY_WORK}/ (not in git); `make exercises` rewrites exercises/, never {MY_WORK}/")
            return 0
        if action == "build":
            for p in build(path):
                print(f"wrote {p}")
            print("exercises/ is up to date")
            return 0
        problems = check(path)
    except (MarkerError, NotebookError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        print("run `python -m hpclab exercises build` (exercises/ is generated from solutions/)", file=sys.stderr)
        return 1
    print(f"exercises/ matches solutions/ ({len(list(_pairs(path)))} notebooks)")
    return 0
