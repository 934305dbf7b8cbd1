"""What the workbook promises a teacher: its pace, its prompts, and exercises 01 and 03's checks.

Each notebook opens with its objectives and a line ``**Time:** M min on the core path (T teaching + E
exercise)``; the core paths sum to at most four hours, the parts an afternoon cannot hold are marked
*Going further*, and every notebook asks at least once to predict before running.
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
TIME = re.compile(r"\*\*Time:\*\* (\d+) min on the core path \((\d+) teaching \+ (\d+) exercise\)")


def _markdown(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


def test_every_notebook_states_objectives_and_minutes_and_the_core_path_fits_four_hours():
    minutes = {}
    for path in LESSONS:
        title = _markdown(path)[0]
        assert "**Objectives.**" in title, f"{path.name}: no objectives in its first cell"
        m = TIME.search(title)
        assert m, f"{path.name}: no '**Time:** M min on the core path (T teaching + E exercise)' in its first cell"
        core, teaching, exercise = map(int, m.groups())
        assert core == teaching + exercise, path.name
        minutes[path.name] = core
    assert len(minutes) == 9 and sum(minutes.values()) <= 240, minutes


def test_the_instructor_guide_schedules_the_minutes_the_notebooks_state():
    guide = (ROOT / "docs" / "instructor.md").read_text()
    for path in LESSONS:
        core, teaching, exercise = TIME.search(_markdown(path)[0]).groups()
        assert re.search(rf"^\| {path.stem} \| {core} \| {teaching} \+ {exercise} \|", guide, re.M), path.stem
    total = sum(int(TIME.search(_markdown(p)[0]).group(1)) for p in LESSONS)
    assert f"| **total** | **{total}** |" in guide


@pytest.mark.parametrize("name", ["04_matmul", "06_conv_halo", "07_data_parallel"])
def test_what_an_afternoon_cannot_hold_is_marked_going_further(name):
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
