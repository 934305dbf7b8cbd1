"""Build ``exercises/`` from ``solutions/``, check that it is current, link solution cells to lessons.

An exercise is its solution without outputs, each answer (a code cell's lines between ``### BEGIN
SOLUTION`` and ``### END SOLUTION``) replaced by a line raising ``NotImplementedError``. ``copy`` puts
the exercises into ``my-work/`` (ignored by git), never overwriting a notebook already there.

One source per cell: a solution cell that repeats a cell of its lesson (``notebooks/`` notebook of the
same name) carries that cell's id in its metadata, ``{"hpclab": {"from": "<cell id>"}}``; ``build`` fills
it from the lesson and ``check`` fails on a copy that differs. ``link`` adds the metadata.

Not nbgrader: its ClearSolutions preprocessor clears the same markers, but it comes with a grading system
(a database, Jupyter server extensions) for what :func:`strip_solution` does in twenty lines.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
from nbformat.v4.nbbase import random_cell_id

from hpclab.options import UsageError
from hpclab.stub import MESSAGE

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
LESSONS = "notebooks"
STUB = f'raise NotImplementedError("{MESSAGE}")'   # (hpclab.stub.written finds it in a kernel)


class MarkerError(ValueError):
    pass


class NotebookError(ValueError):
    """A notebook that cannot be read or written, or a link to a lesson cell that cannot be followed."""


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
        cell.metadata.pop("hpclab", None)     # the link to a lesson cell means nothing in the learner's copy
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


def source_of(cell) -> str | None:
    """The id of the lesson cell this solution cell is a copy of, if it is one."""
    link = cell.get("metadata", {}).get("hpclab", {}).get("from")
    return str(link) if link else None


def filled(solution: Path, root: Path) -> nbformat.NotebookNode:
    """The solution notebook with every linked cell's source taken from its lesson cell."""
    nb = _read(solution)
    links = [(index, cell, source_of(cell)) for index, cell in enumerate(nb.cells) if source_of(cell)]
    if not links:
        return nb
    lesson_path = root / LESSONS / solution.name
    if not lesson_path.is_file():
        raise NotebookError(f"{solution} has cells copied from {lesson_path}, which does not exist; restore it, "
                            "or remove the cells' hpclab.from metadata")
    lesson = {cell.get("id"): cell for cell in _read(lesson_path).cells}
    for index, cell, cell_id in links:
        origin = lesson.get(cell_id)
        if origin is None:
            raise NotebookError(f"{solution} cell {index} is a copy of cell {cell_id!r} of {lesson_path}, which has "
                            "no cell with that id; link it again (hpclab exercises link) or remove its hpclab.from "
                            "metadata")
        if origin.cell_type != cell.cell_type:
            raise NotebookError(f"{solution} cell {index} is a {cell.cell_type} cell copied from a "
                                f"{origin.cell_type} cell ({cell_id!r} in {lesson_path})")
        cell.source = origin.source
    return nb


def check_root(root: Path, source: str = "solutions") -> Path:
    """The project root given by --root must hold ``source``/ (solutions/ to build or check,
    exercises/ to copy): say so before doing anything."""
    hint = "give the project root (the folder with solutions/ and exercises/)"
    if not root.is_dir():
        raise UsageError(f"hpclab exercises: error: --root {root}: no such folder; {hint}")
    if not (root / source).is_dir():
        raise UsageError(f"hpclab exercises: error: --root {root} has no {source}/ folder; {hint}")
    if not any((root / source).glob("*.ipynb")):
        raise UsageError(f"hpclab exercises: error: --root {root}: {source}/ holds no notebooks")
    return root


def build(root: Path) -> list[Path]:
    folder = root / "exercises"
    if folder.exists() and not folder.is_dir():
        raise NotebookError(f"{folder} is a file, but exercises are written into a folder of that name; "
                            "move the file away")
    folder.mkdir(exist_ok=True)
    written = []
    for solution, exercise in _pairs(root):
        nb = filled(solution, root)
        for path, text in ((solution, nbformat.writes(nb) + "\n"),
                           (exercise, nbformat.writes(exercise_notebook(nb, solution.name)) + "\n")):
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)
                written.append(path)
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
        nb, want = _read(solution), filled(solution, root)    # unreadable: the check stops, nothing to compare
        lesson = root / LESSONS / solution.name           # linked cells edited by hand differ from their lesson
        problems += [f"{solution} cell {index} differs from cell {source_of(cell)!r} of {lesson}, its source: "
                     "edit the lesson notebook, then build"
                     for index, (cell, origin) in enumerate(zip(nb.cells, want.cells)) if cell.source != origin.source]
        expected = nbformat.writes(exercise_notebook(want, solution.name)) + "\n"
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


def link(solution: Path, root: Path, write: bool = True) -> list[tuple[int, str, int]]:
    """Link each solution cell that is identical to a lesson cell: [(cell index, lesson cell id, lines)].

    The lesson notebook's cells get ids first where they have none (nbformat 4.5). A cell already
    linked, an empty cell and a cell holding an answer (the solution markers) are left as they are.
    """
    lesson_path = root / LESSONS / solution.name
    if not lesson_path.is_file():
        raise NotebookError(f"{solution} has no lesson notebook {lesson_path} to link to")
    nb, lesson = _read(solution), _read(lesson_path)
    ids_added = any("id" not in cell for cell in lesson.cells)
    if ids_added:
        lesson.nbformat_minor = max(lesson.nbformat_minor, 5)
        for cell in lesson.cells:
            cell.setdefault("id", random_cell_id())
    used, found = set(), []
    for index, cell in enumerate(nb.cells):
        if source_of(cell) or not cell.source.strip() or BEGIN in cell.source:
            continue
        same = [c for c in lesson.cells if c.cell_type == cell.cell_type and c.source == cell.source]
        origin = next((c for c in same if c.id not in used), same[0] if same else None)
        if origin is None:
            continue
        used.add(origin.id)
        cell.metadata.setdefault("hpclab", {})["from"] = origin.id
        found.append((index, origin.id, len(cell.source.splitlines())))
    if write and found:
        if ids_added:
            lesson_path.write_text(nbformat.writes(lesson) + "\n")
        solution.write_text(nbformat.writes(nb) + "\n")
    return found


def _link_all(root: Path, names: list[str], dry_run: bool) -> int:
    solutions = [Path(n) if Path(n).is_file() else root / "solutions" / Path(n).name for n in names] \
        or [s for s, _ in _pairs(root)]
    total_cells = total_lines = linked_cells = linked_lines = 0
    for solution in solutions:
        if not solution.is_file():
            raise NotebookError(f"{solution}: no such solution notebook")
        cells = _read(solution).cells
        found = link(solution, root, write=not dry_run)
        lines = sum(len(c.source.splitlines()) for c in cells)
        done = sum(n for _, _, n in found)
        total_cells, total_lines = total_cells + len(cells), total_lines + lines
        linked_cells, linked_lines = linked_cells + len(found), linked_lines + done
        print(f"{solution}: {'would link' if dry_run else 'linked'} {len(found)} of {len(cells)} cells "
              f"({done} of {lines} lines) to {root / LESSONS / solution.name}"
              + (f": cells {', '.join(str(i) for i, _, _ in found)}" if found else ""))
    print(f"{'would link' if dry_run else 'linked'} {linked_cells} of {total_cells} cells, {linked_lines} of "
          f"{total_lines} lines" + ("" if dry_run else "; now `hpclab exercises build`, and commit notebooks/ too"))
    return 0


MY_WORK = "my-work"


def copy(root: Path) -> list[tuple[Path, bool]]:
    """Copy each exercise into my-work/ unless a notebook of that name is there: (path, copied)."""
    (root / MY_WORK).mkdir(exist_ok=True)
    done = []
    for exercise in sorted((root / "exercises").glob("*.ipynb")):
        target = root / MY_WORK / exercise.name
        done.append((target, not target.exists()))
        if done[-1][1]:
            target.write_bytes(exercise.read_bytes())
    return done


def main(action: str, root: str = ".", notebooks: list[str] | None = None, dry_run: bool = False) -> int:
    # A UsageError: the hpclab command says it and exits with 2.
    path = check_root(Path(root), "exercises" if action == "copy" else "solutions")
    if notebooks and action != "link":
        raise UsageError(f"hpclab exercises {action}: error: notebooks are named only for link")
    try:
        if action == "link":
            return _link_all(path, notebooks or [], dry_run)
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
    except (MarkerError, NotebookError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        print("run `python -m hpclab exercises build` (exercises/ is generated from solutions/)", file=sys.stderr)
        return 1
    print(f"exercises/ matches solutions/ ({len(list(_pairs(path)))} notebooks)")
    return 0
