"""What the workbook promises a teacher: its pace, its prompts, and exercises 01 and 03's checks.

Each notebook opens with its objectives and a line ``**Time:** M min on the core path (T teaching + E
exercise)``; the instructor's guide (docs/instructor.md) lists those minutes, notebook 08 with its 30 min
while it is not in notebooks/ yet, and lays them out in a day that leaves room for the workshop's lecture
and for slack; the parts the day cannot hold are marked *Going further*, and every notebook asks at least
once to predict before running.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from hpclab.collectives import check as collectives
from hpclab.pi import check as pi

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
GUIDE = ROOT / "docs" / "instructor.md"
TIME = re.compile(r"\*\*Time:\*\* (\d+) min on the core path \((\d+) teaching \+ (\d+) exercise\)")
# Notebook 08 (beyond data parallelism) comes last; until its file is in notebooks/, the guide schedules it by
# its number with these minutes.
NOTEBOOK_08 = {"core": 30, "teaching": 20, "exercise": 10}
DAY_ROW = re.compile(r"^\| (\d\d):(\d\d) \| (\d+|—) \| ([^|]+?) \|", re.M)
BREAKS = {"break", "lunch"}
MIN_LECTURE = MIN_SLACK = 45            # minutes of the day: the workshop's slides, and room for what goes wrong
CLASS_DAY = 6 * 60                      # lecture, notebooks and slack: six hours, breaks besides


def _markdown(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


def _stated() -> dict[str, tuple[int, int, int]]:
    """{notebook stem: (core, teaching, exercise)} as each notebook's first cell states them."""
    out = {}
    for path in LESSONS:
        m = TIME.search(_markdown(path)[0])
        assert m, f"{path.name}: no '**Time:** M min on the core path (T teaching + E exercise)' in its first cell"
        out[path.stem] = tuple(map(int, m.groups()))
    return out


def _has_08() -> bool:
    return any(p.name.startswith("08_") for p in LESSONS)


def _day(guide: str) -> list[tuple[int, int | None, str]]:
    """The day's schedule table, (start in minutes, minutes or None, part) per row; the section *The day*."""
    section = re.search(r"^### The day\n(.*?)(?=^#{1,3} )", guide, re.S | re.M)
    assert section, "docs/instructor.md has no '### The day' section"
    rows = [(int(h) * 60 + int(m), None if mins == "—" else int(mins), part.strip())
            for h, m, mins, part in DAY_ROW.findall(section.group(1))]
    assert rows, "no rows '| HH:MM | minutes | part | what |' in the day's table"
    return rows


def test_every_notebook_states_objectives_and_minutes():
    stated = _stated()
    for path in LESSONS:
        assert "**Objectives.**" in _markdown(path)[0], f"{path.name}: no objectives in its first cell"
        core, teaching, exercise = stated[path.stem]
        assert core == teaching + exercise, path.name
    numbers = [stem[:2] for stem in stated]
    assert numbers == [f"{i:02d}" for i in range(9 if _has_08() else 8)], numbers   # 00 .. 07, then 08


def test_the_instructor_guide_schedules_the_minutes_the_notebooks_state():
    guide = GUIDE.read_text()
    stated = _stated()
    for stem, (core, teaching, exercise) in stated.items():
        assert re.search(rf"^\| {stem} \| {core} \| {teaching} \+ {exercise} \|", guide, re.M), stem
    total = sum(core for core, _, _ in stated.values())
    if not _has_08():
        n = NOTEBOOK_08
        assert re.search(rf"^\| 08\b[^|]*\| {n['core']} \| {n['teaching']} \+ {n['exercise']} \|", guide, re.M), \
            "the guide's table has no row for notebook 08 with its minutes"
        total += n["core"]
    assert f"| **total** | **{total}** |" in guide


def test_the_day_holds_the_notebooks_with_lecture_and_slack():
    """The day's table runs without gaps; every notebook gets its stated minutes, in order, 08 last; the day
    leaves at least 45 min of the workshop's lecture and 45 of slack, in six hours of class besides breaks."""
    rows = _day(GUIDE.read_text())
    for (start, minutes, part), (following, _, _) in zip(rows, rows[1:]):
        assert minutes is not None and start + minutes == following, f"the row '{part}' at {start // 60}:{start % 60:02d}"
    assert rows[-1][2] == "end", "the day's last row is its end: | HH:MM | — | end | ... |"
    stated = {stem: core for stem, (core, _, _) in _stated().items()}
    if not _has_08():
        stated["08"] = NOTEBOOK_08["core"]
    kinds = {"lecture", "slack", "end"} | BREAKS
    parts = [part for _, _, part in rows]
    assert set(parts) <= kinds | set(stated), sorted(set(parts) - kinds - set(stated))
    scheduled = {stem: sum(m for _, m, part in rows if part == stem) for stem in stated}
    assert scheduled == stated, scheduled
    order = list(dict.fromkeys(p for p in parts if p in stated))
    assert order == sorted(stated, key=lambda s: s[:2]), order
    minutes = {kind: sum(m for _, m, part in rows if part == kind) for kind in ("lecture", "slack")}
    assert minutes["lecture"] >= MIN_LECTURE and minutes["slack"] >= MIN_SLACK, minutes
    class_time = rows[-1][0] - rows[0][0] - sum(m for _, m, part in rows if part in BREAKS)
    assert class_time <= CLASS_DAY, class_time
    assert class_time == sum(stated.values()) + minutes["lecture"] + minutes["slack"]


@pytest.mark.parametrize("name", ["02_pi_midpoint", "03_monte_carlo", "04_matmul", "05_gpu_communication",
                                  "06_conv_halo", "07_data_parallel"])
def test_what_the_day_cannot_hold_is_marked_going_further(name):
    text = "\n".join(_markdown(ROOT / "notebooks" / f"{name}.ipynb"))
    assert "Going further (optional)" in text and re.search(r"Going further\*?\*? \(", text)


@pytest.mark.parametrize("path", LESSONS + [ROOT / "solutions" / "01_collectives.ipynb", ROOT / "solutions" / "03_monte_carlo.ipynb"],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_asks_for_a_prediction(path):
    assert any("**Predict, then run.**" in t for t in _markdown(path)), path.name


# ---------------------------------------------------------------- exercise 01: the predictions

RIGHT = {"reduce": [[10], [2], [3], [4]], "allreduce": [[10]] * 4, "allgather": [[1, 2, 3, 4]] * 4}


def test_predictions_right_and_named_loosely():
    assert collectives.predictions(RIGHT, quiet=True)
    assert collectives.predictions({"Reduce": RIGHT["reduce"], "AllReduce": RIGHT["allreduce"],
                                    "all-gather": RIGHT["allgather"]}, quiet=True)


@pytest.mark.parametrize("answer, says", [
    ({}, "missing: reduce, allreduce, allgather"),
    (None, "answer needs the keys 'reduce', 'allreduce', 'allgather'"),
    ({"reduce": RIGHT["reduce"]}, "missing: allreduce, allgather"),
    ({**RIGHT, "reduce": [[10]] * 4}, "reduce: not what the 4 GPUs hold"),
    ({**RIGHT, "allreduce": [[1], [2], [3], [4]]}, "allreduce: not what"),
    ({**RIGHT, "allgather": [[1, 2, 3, 4]]}, "allgather: not what"),
    ({**RIGHT, "allgather": [[4, 3, 2, 1]] * 4}, "in which order?"),
])
def test_a_wrong_or_empty_prediction_fails_without_giving_the_answer(answer, says):
    verdict = collectives.predictions(answer, quiet=True)
    assert not verdict and says in verdict.message, verdict.message
    assert "10" not in verdict.message and "1, 2, 3, 4" not in verdict.message, verdict.message


def test_exercise_01_states_the_keys_and_its_stub_hides_the_answer():
    solution = nbformat.read(ROOT / "solutions" / "01_collectives.ipynb", as_version=4)
    exercise = nbformat.read(ROOT / "exercises" / "01_collectives.ipynb", as_version=4)
    text = next(c.source for c in solution.cells if "**Predict, then run.**" in c.source)
    assert all(f'`"{k}"`' in text for k in RIGHT)
    stub = next(c.source for c in exercise.cells if "check.predictions(answer)" in c.source)
    assert "NotImplementedError" in stub and "[[10]" not in stub


# ---------------------------------------------------------------- exercise 03: streams, 1/sqrt(N), speedup

def test_samples_for_wants_the_fewest_samples_that_reach_the_error():
    import math

    exact = lambda t: math.ceil(16 * math.pi / 4 * (1 - math.pi / 4) / t**2)    # noqa: E731
    assert pi.samples_for(exact, quiet=True)
    for wrong, says in ((lambda t: int(1 / t), "at most"), (lambda t: 4 * exact(t), "already reach"),
                        (lambda t: float(exact(t)), "at most")):
        verdict = pi.samples_for(wrong, quiet=True)
        assert not verdict and says in verdict.message, verdict.message


def test_speedups_want_t1_over_tn_and_efficiency_per_gpu():
    times = {1: 45.212765, 2: 22.60887, 4: 11.409895}
    assert pi.speedups(lambda t: {n: (t[1] / v, t[1] / v / n) for n, v in t.items()}, times, quiet=True)
    inverted = pi.speedups(lambda t: {n: (v / t[1], v / t[1] / n) for n, v in t.items()}, times, quiet=True)
    assert not inverted and "the other way round" in inverted.message
    no_per_gpu = pi.speedups(lambda t: {n: (t[1] / v, t[1] / v) for n, v in t.items()}, times, quiet=True)
    assert not no_per_gpu and "per GPU" in no_per_gpu.message
    assert not pi.speedups(lambda t: {1: (1.0, 1.0)}, times, quiet=True)


def test_exercise_03_practises_what_03_teaches_not_02s_slice():
    exercise = "\n".join(c.source for c in nbformat.read(ROOT / "exercises" / "03_monte_carlo.ipynb", as_version=4).cells)
    assert "my_share" not in exercise and "check.slices" not in exercise
    for check in ("check.hit_count(", "check.samples_for(samples_for)", "check.speedups(speedup_efficiency"):
        assert check in exercise
    assert exercise.count("NotImplementedError") == 3
