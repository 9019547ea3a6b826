"""The course is one path: the notebooks' numbers are the reading order, every lesson says
what it needs (earlier lessons only) and links to the next file, lesson 00's table and
README's course table list every lesson in that order, and every lesson has graded work."""

from __future__ import annotations

import json
import re

import pytest
from helpers import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUMBERS = [int(p.name[:2]) for p in NOTEBOOKS]
LINK = re.compile(r"\[([^\]]+)\]\((\d\d_[a-z0-9_]+\.ipynb)\)")
# Lessons without an exercise yet, and why: a lesson is not finished until it has one.
NO_EXERCISE_YET = {}


def _cells(path, kind=None):
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if kind is None or c["cell_type"] == kind]


def test_the_numbers_are_one_sequence_from_00():
    assert NUMBERS == list(range(len(NOTEBOOKS))), [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lesson_states_its_number_what_it_needs_and_the_next_lesson(path):
    n = int(path.name[:2])
    markdown = _cells(path, "markdown")
    assert markdown[0].startswith(f"# {n:02d} · "), (
        f"{path.name}: its title is not '# {n:02d} · ...'")
    # the paragraph from the line that starts "*Needs:*" to the next blank line
    needs = [p for p in markdown[0].split("\n\n") if p.startswith("*Needs:*")]
    if n == 0:
        assert needs == []
    else:
        assert len(needs) == 1, f"{path.name} does not say what it needs (*Needs:* ...)"
        needed = [int(target[:2]) for _, target in LINK.findall(needs[0])]
        assert needed and all(k < n for k in needed), f"{path.name} needs {needed}"
        assert all((ROOT / "notebooks" / t).exists() for _, t in LINK.findall(needs[0]))
    nexts = LINK.findall(markdown[-1].split("Next:")[-1]) if "Next:" in markdown[-1] else []
    if path == NOTEBOOKS[-1]:
        assert nexts == [], f"{path.name} is the last lesson and links to a next one"
    else:
        following = NOTEBOOKS[NOTEBOOKS.index(path) + 1]
        assert nexts and nexts[0][1] == following.name, (
            f"{path.name}'s last cell must end with 'Next: [..]({following.name})'")


def test_lesson_00s_table_lists_every_lesson_in_order():
    table = next(c for c in _cells(NOTEBOOKS[0], "markdown") if c.startswith("## The course"))
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    listed = ["00_welcome.ipynb"] + [LINK.search(r).group(2) for r in rows[1:]]
    assert listed == [p.name for p in NOTEBOOKS]


def test_readmes_table_lists_every_lesson_in_order():
    text = (ROOT / "README.md").read_text()
    listed = re.findall(r"^\| `(\d\d_[a-z0-9_]+)` \|", text, flags=re.M)
    assert listed == [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_lesson_has_graded_work(path):
    n = int(path.name[:2])
    graded = any(f'mt.grade("ex{n:02d}")' in source for source in _cells(path, "code"))
    if n in NO_EXERCISE_YET:
        assert not graded, f"{path.name} has an exercise now: remove it from NO_EXERCISE_YET"
        return
    assert graded, f"{path.name} has no grader cell mt.grade(\"ex{n:02d}\")"
    # ...and a cell, checked by nbval, where the reference solution passes every check: the
    # one place the suite grades each solution (tests/course/test_exercises.py does not)
    reference = [s for s in _cells(path, "code")
                 if f'mt.grade("ex{n:02d}", solutions=True)' in s]
    assert len(reference) == 1, f"{path.name}: no cell grades the reference solution"
    assert "assert report.passed" in reference[0] and "NBVAL" not in reference[0], reference[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_lesson_asks_questions_and_shows_each(path):
    """2 to 5 graded questions per lesson (minitp/course/questions/lessonNN.py), at least
    one a design decision, each shown and checked in the lesson."""
    from minitp.course.questions import QUESTIONS

    n = path.name[:2]
    mine = sorted(k for k in QUESTIONS if k.startswith(f"{n}."))
    assert 2 <= len(mine) <= 5, f"lesson {n} asks {len(mine)} questions: {mine}"
    assert any(QUESTIONS[k]().kind == "choice" for k in mine), f"lesson {n}: no design question"
    code = "\n".join(_cells(path, "code"))
    for key in mine:
        assert f'mt.question("{key}"' in code, f"{path.name} never asks {key}"
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith(f"| `{path.stem}` |"))
    names = row.rpartition("questions: ")[2].split(" | ")[0].split(", ")
    assert sorted(names) == sorted(k.split(".", 1)[1] for k in mine), (
        f"README's row for {path.stem} does not list its questions")
