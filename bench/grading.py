"""How long grading takes: every exercise's reference solution graded, timed, one run.

Grading is what a learner waits for after each exercise, so it should feel instant
where it can: ex17 (a plan chosen by the calculator, no processes) in well under a
second once its reference plans are cached, the others a few seconds of real
processes. These were timing assertions in the tests; on a noisy 2-core machine they
belong here, measured and printed, never asserted.

    python bench/grading.py               # every exercise, twice (cold, then warm)
    python bench/grading.py ex17 ex01     # only these
"""

from __future__ import annotations

import argparse
import time

import minitp as mt
from minitp.course.graders import EXERCISES


def seconds_to_grade(exercise: str) -> float:
    started = time.perf_counter()
    report = mt.grade(exercise, solutions=True)
    elapsed = time.perf_counter() - started
    if not report.passed:
        raise SystemExit(f"{exercise}'s reference solution failed its grader:\n{report}")
    return elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exercises", nargs="*", help="exercise names (default: all)")
    args = parser.parse_args(argv)
    names = args.exercises or sorted(EXERCISES)
    print(f"{'exercise':<10} {'cold s':>8} {'warm s':>8}")
    for name in names:
        cold = seconds_to_grade(name)  # the first grade also starts the forkserver
        warm = seconds_to_grade(name)
        print(f"{name:<10} {cold:>8.2f} {warm:>8.2f}")


if __name__ == "__main__":
    main()
