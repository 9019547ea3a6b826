"""Where the suite's time goes, per test folder, written into docs/testing.md.

    python tools/test_durations.py                   # run the whole suite, then write the table
    python tools/test_durations.py --junit run.xml   # the table of a run already made
                                                     # (pytest --junitxml=run.xml)

The table goes between the two `durations` markers of docs/testing.md; nothing in it is
typed by hand. A folder's time is the sum of its tests' own times (setup and teardown
included), so the rows add up to the run's test time, not to its wall-clock time.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "testing.md"
START, END = "<!-- durations:start -->", "<!-- durations:end -->"


def folder_of(classname: str) -> str:
    """tests.calc.test_calc -> tests/calc; notebooks.03_x.ipynb -> notebooks."""
    parts = classname.split(".")
    if parts[0] == "notebooks":
        return "notebooks"
    # drop the module (and a test class, which starts with a capital letter)
    while parts and (parts[-1].startswith("test_") or parts[-1][:1].isupper()):
        parts.pop()
    return "/".join(parts) or classname


def read_junit(path: Path) -> tuple[dict[str, list[float]], dict[str, int]]:
    times: dict[str, list[float]] = defaultdict(list)
    outcomes = {"passed": 0, "failed": 0, "skipped": 0}
    for case in ET.parse(path).getroot().iter("testcase"):
        times[folder_of(case.get("classname", ""))].append(float(case.get("time", 0)))
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes["failed"] += 1
        elif case.find("skipped") is not None:
            outcomes["skipped"] += 1
        else:
            outcomes["passed"] += 1
    return times, outcomes


def table(times: dict[str, list[float]], outcomes: dict[str, int], wall: float | None) -> str:
    total = sum(sum(t) for t in times.values())
    rows = sorted(times.items(), key=lambda kv: -sum(kv[1]))
    lines = [f"Measured {datetime.date.today()} on {os.cpu_count()} cores: "
             f"{outcomes['passed']} passed, {outcomes['failed']} failed, "
             f"{outcomes['skipped']} skipped"
             + (f"; the run took {wall / 60:.1f} min" if wall else "") + ".",
             "", "| folder | tests | seconds | share |", "|---|---:|---:|---:|"]
    for folder, spent in rows:
        lines.append(f"| `{folder}` | {len(spent)} | {sum(spent):.0f} | "
                     f"{100 * sum(spent) / total:.0f}% |")
    lines.append(f"| all | {sum(len(t) for t in times.values())} | {total:.0f} | 100% |")
    return "\n".join(lines)


def write(text: str) -> None:
    page = PAGE.read_text()
    if START not in page or END not in page:
        raise SystemExit(f"{PAGE} has no {START} ... {END} markers to write between")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path, help="a run's --junitxml file (else: run pytest)")
    args, pytest_args = parser.parse_known_args(argv)
    wall = None
    if args.junit is None:
        args.junit = Path(tempfile.mkdtemp()) / "run.xml"
        started = datetime.datetime.now()
        subprocess.run([sys.executable, "-m", "pytest", f"--junitxml={args.junit}",
                        *pytest_args], cwd=ROOT, check=False)
        wall = (datetime.datetime.now() - started).total_seconds()
    times, outcomes = read_junit(args.junit)
    write(table(times, outcomes, wall))
    print(f"wrote the durations of {sum(outcomes.values())} tests into {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
