"""The reading order never reaches forward: a lesson cites only lessons its *Needs:* lines
reach, and names a later lesson only as a forward pointer.

What counts as citing lesson NN, in a lesson's cells (markdown and code, not outputs), its
questions module (minitp/course/questions/lessonNN.py) and its exercise (exercises/exNN_*.py):
"lesson NN", "lessons NN and MM", "lessons NN, MM and KK", "lessons NN–MM" (every lesson of
the range), a link to NN_*.ipynb, and in markdown a parenthesised list such as "(07 and 17)".
A lone "(NN)" is not counted: code and prose use it for numbers.

The rule, stated once (lesson 00 tells the reader the same):

- an earlier lesson cited must be reachable through the *Needs:* lines, followed transitively;
- a later lesson may be named only as a forward pointer, written "ahead: lesson NN" (or
  "ahead: lessons NN and MM"): a place to read more, never something the lesson relies on;
- exempt: the *Needs:* paragraph itself, the last cell's "Next:" link, and lesson 00's table
  of the course (it is the map).
"""

from __future__ import annotations

import json
import re

import pytest
from helpers import ROOT

from minitp.course.estimate import needs

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUMBER = {p: int(p.name[:2]) for p in NOTEBOOKS}
_LIST = r"\d\d(?:[–-]\d\d)?(?:(?:, and |, | and | or )\d\d(?:[–-]\d\d)?)*"
CITES = (re.compile(rf"\blessons? ({_LIST})", re.IGNORECASE),
         re.compile(r"\((\d\d)_[a-z0-9_]+\.ipynb\)"))
LISTED = re.compile(r"\((\d\d(?:, \d\d)* and \d\d)\)")  # "(07 and 17)", markdown only
AHEAD = re.compile(r"ahead: $", re.IGNORECASE)


def _lessons(text: str) -> list[int]:
    found = []
    for first, last in re.findall(r"(\d\d)(?:[–-](\d\d))?", text):
        found += range(int(first), int(last or first) + 1)
    return found


def _sources(path):
    """(where, text, markdown?) for every cell, the questions module and the exercise."""
    n = NUMBER[path]
    cells = json.loads(path.read_text())["cells"]
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        if i == 0:
            title = text.partition("*Needs:*")
            text = title[0] + title[2].partition("\n\n")[2]
        if i == len(cells) - 1 and "Next:" in text:
            text = text.rpartition("Next:")[0]
        if n == 0 and text.startswith("## The course"):
            continue
        yield f"cell {i}", text, cell["cell_type"] == "markdown"
    for extra in [ROOT / "minitp" / "course" / "questions" / f"lesson{n:02d}.py",
                  *(ROOT / "exercises").glob(f"ex{n:02d}_*.py")]:
        if extra.exists():
            yield extra.name, extra.read_text(), False


def cited(text: str, patterns) -> list:
    """(lesson cited, written as a forward pointer?, the words around it) in ``text``."""
    found = []
    for pattern in patterns:
        for m in pattern.finditer(text):
            ahead = bool(AHEAD.search(text[max(0, m.start() - 7):m.start()]))
            around = " ".join(text[max(0, m.start() - 50):m.end() + 30].split())
            found += [(k, ahead, around) for k in _lessons(m.group(1))]
    return found


def citations(path):
    """(where, lesson cited, written as a forward pointer?, the words around it)."""
    for where, text, markdown in _sources(path):
        for k, ahead, around in cited(text, CITES + ((LISTED,) if markdown else ())):
            yield where, k, ahead, around


def reachable(n: int, graph: dict) -> set:
    seen, todo = set(), list(graph[n])
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo += graph.get(k, [])
    return seen


NEEDS = {NUMBER[p]: needs("".join(json.loads(p.read_text())["cells"][0]["source"]))
         for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lesson_cites_only_what_its_needs_reach_and_points_ahead_explicitly(path):
    n = NUMBER[path]
    before = reachable(n, NEEDS)
    wrong = []
    for where, k, ahead, around in citations(path):
        if k == n or (k < n and k in before) or (k > n and ahead):
            continue
        why = ("a later lesson, not written 'ahead: lesson NN'" if k > n
               else "not reached by the Needs lines")
        wrong.append(f"{where}: lesson {k:02d} is {why}: ...{around}...")
    assert not wrong, f"{path.name}:\n" + "\n".join(wrong)


def test_the_scan_finds_every_form_of_citation():
    """The forms the rule names are found, and a forward pointer is told from a reach."""
    text = ("as lesson 03 showed; lessons 05 and 07; lessons 02–04, and 11 (07 and 17), "
            "see [x](12_zero_bubble_pipelines.ipynb), (ahead: lesson 20), exp(12)")
    found = [(k, ahead) for k, ahead, _ in cited(text, CITES + (LISTED,))]
    assert sorted(found) == sorted([(3, False), (5, False), (7, False), (2, False),
                                    (3, False), (4, False), (11, False), (7, False),
                                    (17, False), (12, False), (20, True)])
