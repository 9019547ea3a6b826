"""minitp.course.estimate: the model of a learner's hours, the core paths it prices, and the
prose (lesson 00, README) that quotes it."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT

from minitp.course import estimate


@pytest.fixture(scope="module")
def lessons():
    return {lesson.number: lesson for lesson in estimate.lessons()}


def test_a_lessons_minutes_follow_the_model():
    lesson = estimate.Lesson(7, "07_x", (5,), prose_words=1500, code_words=750, code_cells=6,
                             exercise_words=300, solution_lines=20, questions=2)
    # fast: 1500/150 + 750/75 + 6 cells × 10 s + 300/150 + max(30, 20 × 2) + 2 × 5
    assert lesson.minutes("fast", run_seconds_per_cell=10) == 10 + 10 + 1 + 2 + 40 + 10
    assert lesson.minutes("fast", 10, exercise=False) == 10 + 10 + 1 + 10
    short = estimate.Lesson(7, "07_x", (5,), 0, 0, 0, 0, solution_lines=3, questions=0)
    assert short.minutes("slow", 0) == estimate.EXERCISE_FLOOR_MINUTES
    with pytest.raises(ValueError, match="pace must be one of"):
        lesson.minutes("brisk", 10)


def test_only_the_lines_a_learner_writes_are_counted():
    text = ("def f():\n    # BEGIN SOLUTION\n    # hint: think\n    x = 1\n\n    return x\n"
            "    # END SOLUTION\nprint(f())\n")
    assert estimate._solution_lines(text) == 2


@pytest.mark.parametrize("name", sorted(estimate.PATHS))
def test_a_path_takes_every_lesson_its_lessons_need(name, lessons):
    taken = set(estimate.PATHS[name])
    missing = {n: sorted(set(lessons[n].needs) - taken) for n in taken}
    assert not any(missing.values()), f"{name}: lessons it takes need what it skips: {missing}"


@pytest.mark.parametrize("name", sorted(estimate.PATHS))
def test_a_path_fits_its_time_even_at_the_slow_pace(name):
    hours = estimate.path_hours(name)
    assert hours["fast"] < hours["slow"] <= estimate.PATH_LIMITS[name], (name, hours)


def test_lesson_00_and_readme_quote_the_models_hours():
    total = estimate.course()
    quoted = estimate.hours_range(total["fast_hours"], total["slow_hours"])
    cells = json.loads((ROOT / "notebooks" / "00_welcome.ipynb").read_text())["cells"]
    lesson_00 = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert f"about **{quoted} hours**" in lesson_00, f"lesson 00 must say about {quoted} hours"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"about {quoted} hours in all" in readme, f"README must say about {quoted} hours"
