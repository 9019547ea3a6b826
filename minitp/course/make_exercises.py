"""Generate the learner's files in exercises/ from the complete ones in solutions/.

    python -m minitp.course.make_exercises          # write exercises/ from solutions/
    python -m minitp.course.make_exercises --check  # exit 1 if exercises/ is out of date

In a solution, the lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION``
become a single ``raise NotImplementedError("<hint>")`` at the same indentation.
The hint is the text of the ``# hint: …`` comment lines that directly follow
``# BEGIN SOLUTION`` (they stay in the exercise too, as guidance).
solutions/ is the source of truth; never edit exercises/ by hand (a test checks
that they agree).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

from .paths import repo_root

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION\s*$")
HINT = re.compile(r"^\s*# hint:\s?(?P<text>.*)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
HEADER = (
    "# Fill in the NotImplementedError lines, then grade: {grade}\n"
    "# Made from solutions/{name} by `python -m minitp.course.make_exercises`.\n"
)


def blank_out(source: str, name: str = "<solution>") -> str:
    """The exercise version of a solution's source text."""
    out, inside, line_no = [], False, 0
    indent, hint, in_hint = "", [], False
    for line_no, line in enumerate(source.splitlines(keepends=True), 1):
        begin = BEGIN.match(line.rstrip("\n"))
        if begin:
            if inside:
                raise ValueError(f"{name}:{line_no}: BEGIN SOLUTION inside another block")
            inside, in_hint, indent, hint = True, True, begin.group("indent"), []
            continue
        if inside and in_hint and HINT.match(line):
            hint.append(HINT.match(line).group("text").strip())
            out.append(line)
            continue
        in_hint = False
        if END.match(line):
            if not inside:
                raise ValueError(f"{name}:{line_no}: END SOLUTION without BEGIN")
            inside = False
            out.append(_raise_line(indent, " ".join(hint) or "write this part"))
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{name}: BEGIN SOLUTION never ended")
    return "".join(out)


def _raise_line(indent: str, hint: str) -> str:
    pieces = textwrap.wrap(hint, width=max(40, 88 - len(indent)), drop_whitespace=False)
    body = "".join(f"{indent}    {piece!r}\n" for piece in pieces)
    return f"{indent}raise NotImplementedError(\n{body}{indent})\n"


def expected_exercises(root: Path | None = None) -> dict[Path, str]:
    """What every file in exercises/ should contain, from solutions/."""
    root = root or repo_root()
    result = {}
    for solution in sorted((root / "solutions").glob("ex*.py")):
        grade = f"python -m minitp.course.grade {solution.name.split('_')[0]}"
        body = blank_out(solution.read_text(), solution.name)
        header = HEADER.format(name=solution.name, grade=grade)
        result[root / "exercises" / solution.name] = header + body
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only check that exercises/ is current"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected_exercises().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(repo_root())}")
    if args.check and stale:
        print("out of date (run python -m minitp.course.make_exercises):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
