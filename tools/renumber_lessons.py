"""Make room for a new lesson (every lesson numbered N or above moves up by one), or swap
two lessons' places in the reading order.

    python tools/renumber_lessons.py --from 9          # 09..16 become 10..17
    python tools/renumber_lessons.py --from 9 --dry-run
    python tools/renumber_lessons.py --swap 9 10       # 09 becomes 10 and 10 becomes 09

A lesson's number is written in many places, and the course's tests hold them to one
sequence (tests/course/test_course_order.py): the notebook's file name and title, its
exercise, solution, grader and grader test (``exNN``), its questions module and their
keys (``lessonNN``, "NN.name"), the course tables (lesson 00, README), the links between
lessons, and prose ("lesson 12's figure", "lessons 07 and 12"). This tool renames the
files with ``git mv`` and rewrites those tokens in every tracked text file, highest
number first so that no number is moved twice. What it cannot know is left to the
author, and it says so: bare numbers (a dict keyed "12"), and the outputs of question
cells (a question's numbers are drawn from its key, so re-execute the moved lessons).
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = (".py", ".md", ".ipynb", ".cfg", ".toml", ".yml", ".yaml", ".txt", ".json", "")
# "lesson 12", "Lessons 01, 07 and 12", "lessons 02–05", "Exercise 12": the numbers after it
PHRASE = re.compile(r"\b([Ll]essons?|[Ee]xercises?) (\d\d(?:(?:, | and | or |–|-)\d\d)*)")


# The tool, its test and the citation scan's test hold lesson numbers as examples: never rewritten.
OWN = ("tools/renumber_lessons.py", "tests/course/test_renumber_lessons.py",
       "tests/course/test_course_citations.py")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / name for name in out if Path(name).suffix in TEXT and (ROOT / name).is_file()
            and name not in OWN]


def moves(start: int) -> list[tuple[int, int]]:
    numbers = sorted(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [(n, n + 1) for n in reversed(numbers) if n >= start]


def rewrite(text: str, old: int, new: int, stems: dict[str, str]) -> str:
    o, n = f"{old:02d}", f"{new:02d}"
    for old_stem, new_stem in stems.items():
        text = re.sub(rf"\b{old_stem}\b", new_stem, text)
    text = re.sub(rf"(?<![A-Za-z0-9])ex{o}(?![0-9])", f"ex{n}", text)  # test_ex12_..., ex12_*.py
    text = re.sub(rf"\blesson{o}\b", f"lesson{n}", text)
    # names in code: test_lesson_12_explorer, LESSON_12
    text = re.sub(rf"(?<![A-Za-z])(lesson|LESSON)_{o}(?![0-9])", rf"\g<1>_{n}", text)
    text = re.sub(rf"(?<![\d.]){o}\.(?=[a-z][a-z0-9-]*[a-z0-9]\b)", f"{n}.", text)  # "12.key"
    text = re.sub(rf"(^|\"|\[|# ){o} · ", rf"\g<1>{n} · ", text, flags=re.M)  # titles, tables
    return PHRASE.sub(lambda m: m[1] + " " + re.sub(rf"\b{o}\b", n, m[2]), text)


# A number no lesson has: a swap parks one lesson there so that no number is moved twice.
PARKED = 99


def swap_moves(a: int, b: int) -> list[tuple[int, int]]:
    return [(b, PARKED), (a, b), (PARKED, a)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--from", dest="start", type=int,
                       help="the number the new lesson takes; lessons from it move up one")
    which.add_argument("--swap", nargs=2, type=int, metavar=("A", "B"),
                       help="two lessons that trade numbers")
    parser.add_argument("--dry-run", action="store_true", help="say what would change")
    args = parser.parse_args()
    files = tracked_files()
    for old, new in (swap_moves(*args.swap) if args.swap else moves(args.start)):
        o, n = f"{old:02d}", f"{new:02d}"
        renames = {}
        for pattern in (f"notebooks/{o}_*.ipynb", f"exercises/ex{o}_*.py", f"solutions/ex{o}_*.py",
                        f"minitp/course/graders/ex{o}.py", f"minitp/course/graders/ex{o}_*.py",
                        f"minitp/course/questions/lesson{o}.py",
                        f"tests/course/test_grader_ex{o}.py",
                        f"tests/course/answers/test_answers_{o}.py"):
            for path in ROOT.glob(pattern):
                renames[path] = path.with_name(path.name.replace(o, n, 1))
        stems = {p.stem: renames[p].stem for p in renames if p.suffix == ".ipynb"}
        for path in files:
            text = path.read_text()
            changed = rewrite(text, old, new, stems)
            if changed != text:
                print(f"{o} -> {n}: {path.relative_to(ROOT)}")
                if not args.dry_run:
                    path.write_text(changed)
        for path, target in renames.items():
            print(f"{o} -> {n}: git mv {path.relative_to(ROOT)} {target.relative_to(ROOT)}")
            if not args.dry_run:
                subprocess.run(["git", "mv", str(path), str(target)], cwd=ROOT, check=True)
        if not args.dry_run:
            files = [renames.get(p, p) for p in files]
    print("now: grep for bare numbers the tool cannot know (a dict keyed by a lesson's "
          "number), and re-execute the moved lessons (their questions' numbers changed)")


if __name__ == "__main__":
    main()
