"""How long the course takes: a MODEL of a learner's hours, lesson by lesson, counted from
the repository each time it is asked (so it follows the lessons as they change).

For each lesson, at two paces (``"fast"`` and ``"slow"``)::

    minutes = prose words / P + code words / C             reading the notebook
            + run seconds / 60                             its cells running
            + exercise words / P + max(30, lines × L)      reading, then writing, the exercise
            + questions × Q                                its graded questions

    fast: P = 150 words a minute, C = 75, L = 2 minutes a line, Q = 5 minutes
    slow: P = 100,                C = 50, L = 4,                 Q = 10

The counts come from the files: prose words from the notebook's markdown cells, code words
from its code cells (sources, not outputs), exercise words from ``exercises/exNN_*.py``, lines
as the non-blank, non-comment lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` in
``solutions/exNN_*.py`` (what the learner writes), questions from
``minitp/course/questions/lessonNN.py``. Run seconds: the seconds CI's strict nbval run took
over every notebook (docs/testing.md's durations table, measured on 2 cores), shared out by
code cells. The rates are assumptions: silent reading of English non-fiction averages 238
words a minute (Brysbaert 2019, J. Memory and Language 109, a meta-analysis of 190 studies);
prose with formulas and figures is studied at half to two-thirds of that, and code slower
again. The 30 minutes are a floor for a short exercise that is mostly reasoning.

    from minitp.course import estimate
    estimate.lessons()              # per lesson: the counts, and hours fast and slow
    estimate.course()               # the totals
    estimate.path_hours("one day")  # a path of PATHS, fast and slow
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .paths import repo_root

PACES = {"fast": {"prose": 150, "code": 75, "line": 2, "question": 5},
         "slow": {"prose": 100, "code": 50, "line": 4, "question": 10}}
EXERCISE_FLOOR_MINUTES = 30
NEEDS_LINK = re.compile(r"\((\d\d)_[a-z0-9_]+\.ipynb\)")

# The core paths, as {lesson: "whole" (with its exercise) or "read" (read, run, questions)}.
# Each takes every lesson its lessons need (a test checks it); the reasons are lesson 00's.
PATHS = {
    "one day": {0: "read", 1: "whole", 2: "whole", 3: "whole"},
    "one week": {**{n: "whole" for n in (0, 1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17)},
                 **{n: "read" for n in (9, 20, 21)}},
}
# What each path must fit, in hours at the slow pace: a workshop day, and five of them.
PATH_LIMITS = {"one day": 8, "one week": 40}


@dataclass(frozen=True)
class Lesson:
    number: int
    name: str
    needs: tuple
    prose_words: int
    code_words: int
    code_cells: int
    exercise_words: int
    solution_lines: int
    questions: int

    def minutes(self, pace: str, run_seconds_per_cell: float,
                exercise: bool = True) -> float:
        """This lesson's minutes at ``pace``; without its exercise when ``exercise`` is False."""
        if pace not in PACES:
            raise ValueError(f"pace must be one of {sorted(PACES)}, got {pace!r}")
        rate = PACES[pace]
        total = (self.prose_words / rate["prose"] + self.code_words / rate["code"]
                 + self.code_cells * run_seconds_per_cell / 60
                 + self.questions * rate["question"])
        if exercise:
            total += (self.exercise_words / rate["prose"]
                      + max(EXERCISE_FLOOR_MINUTES, self.solution_lines * rate["line"]))
        return total


def _words(cells, kind: str) -> int:
    return sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == kind)


def _solution_lines(text: str) -> int:
    inside, count = False, 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "# END SOLUTION":
            inside = False
        elif inside and stripped and not stripped.startswith("#"):
            count += 1
        elif stripped == "# BEGIN SOLUTION":
            inside = True
    return count


def needs(cell0: str) -> tuple:
    """The lessons a title cell's *Needs:* paragraph links to (up to its blank line)."""
    paragraph = cell0.partition("*Needs:*")[2].split("\n\n")[0]
    return tuple(int(k) for k in NEEDS_LINK.findall(paragraph))


def lessons() -> list[Lesson]:
    """Every lesson's counts, read from notebooks/, exercises/, solutions/ and the questions."""
    from .questions import QUESTIONS

    root = repo_root()
    found = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        n, cells = int(path.name[:2]), json.loads(path.read_text(encoding="utf-8"))["cells"]
        exercise = sorted((root / "exercises").glob(f"ex{n:02d}_*.py"))
        solution = sorted((root / "solutions").glob(f"ex{n:02d}_*.py"))
        found.append(Lesson(
            n, path.stem, needs("".join(cells[0]["source"])),
            _words(cells, "markdown"), _words(cells, "code"),
            sum(c["cell_type"] == "code" for c in cells),
            sum(len(p.read_text(encoding="utf-8").split()) for p in exercise),
            sum(_solution_lines(p.read_text(encoding="utf-8")) for p in solution),
            sum(key.startswith(f"{n:02d}.") for key in QUESTIONS)))
    return found


def notebook_seconds() -> float:
    """MEASURED: the seconds CI's strict nbval took over every notebook (docs/testing.md)."""
    table = (repo_root() / "docs" / "testing.md").read_text(encoding="utf-8")
    row = re.search(r"^\| `notebooks` \| \d+ \| (\d+) \|", table, flags=re.M)
    if row is None:
        raise ValueError("docs/testing.md has no `notebooks` row in its durations table")
    return float(row.group(1))


def _per_cell(found: list[Lesson]) -> float:
    return notebook_seconds() / sum(lesson.code_cells for lesson in found)


def course() -> dict:
    """The totals: lessons, prose words, exercises, questions, and hours fast and slow."""
    found = lessons()
    per_cell = _per_cell(found)
    return {"lessons": len(found),
            "prose_words": sum(x.prose_words for x in found),
            "code_words": sum(x.code_words for x in found),
            "exercises": sum(x.solution_lines > 0 for x in found),
            "questions": sum(x.questions for x in found),
            "run_hours": sum(x.code_cells for x in found) * per_cell / 3600,
            **{f"{pace}_hours": sum(x.minutes(pace, per_cell) for x in found) / 60
               for pace in PACES}}


def path_hours(name: str) -> dict:
    """``{"fast": h, "slow": h}`` for the path ``name`` of PATHS."""
    if name not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, got {name!r}")
    found = {x.number: x for x in lessons()}
    per_cell = _per_cell(list(found.values()))
    return {pace: sum(found[n].minutes(pace, per_cell, how == "whole")
                      for n, how in PATHS[name].items()) / 60 for pace in PACES}


def hours_range(fast: float, slow: float) -> str:
    """A range as prose quotes it: each end to the nearest 5 hours."""
    return f"{5 * round(fast / 5)}–{5 * round(slow / 5)}"


def table() -> str:
    """One line per lesson and the totals, as lesson 00 prints them."""
    found = lessons()
    per_cell = _per_cell(found)
    lines = [f"{'lesson':<34}{'prose':>8}{'code':>7}{'lines':>6}{'qs':>4}{'hours (MODEL)':>15}"]
    for x in found:
        fast, slow = (x.minutes(pace, per_cell) / 60 for pace in PACES)
        lines.append(f"{x.name:<34}{x.prose_words:>8,}{x.code_words:>7,}{x.solution_lines:>6}"
                     f"{x.questions:>4}{fast:>9.1f}–{slow:.1f}")
    total = course()
    lines.append(f"{'all ' + str(total['lessons']) + ' lessons':<34}{total['prose_words']:>8,}"
                 f"{total['code_words']:>7,}{'':>6}{total['questions']:>4}"
                 f"{total['fast_hours']:>9.0f}–{total['slow_hours']:.0f}")
    lines.append(f"({total['exercises']} exercises; the cells run {total['run_hours'] * 60:.0f} "
                 "minutes in all, MEASURED by CI's nbval)")
    for name, path in PATHS.items():
        hours = path_hours(name)
        taken = ", ".join(f"{n:02d}" + ("" if how == "whole" else " (read)")
                          for n, how in sorted(path.items()))
        lines.append(f"{name}: {taken}: {hours['fast']:.1f}–{hours['slow']:.1f} hours (MODEL)")
    return "\n".join(lines)
