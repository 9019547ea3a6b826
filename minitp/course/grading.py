"""The exercise grader: runs the learner's code on real processes and says what holds.

    mt.grade("ex01")                          # in a notebook: grades exercises/ex01_*.py
    python -m minitp.course.grade ex01        # the same from a terminal (exit 1 on failure)
    python -m minitp.course.grade ex01 --solutions

Each check says whether it passed; a failed one says which rank, which tensor,
the largest error and a hint. A blank (``NotImplementedError``) or a crash is
reported politely, and a deadlock ends after a short timeout, never hangs.
The checks of each exercise live in ``minitp/course/graders/exNN.py``, on top of
``minitp/course/graders/base.py`` (`Check`, `Report`, `failure_check`, re-exported here);
this module, above them all, loads the learner's file and runs its checks. The
command line is ``minitp/course/grade.py``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
import uuid
from pathlib import Path

import cloudpickle

from .graders import EXERCISES
from .graders.base import Check, Report, failure_check, file_lacks
from .paths import repo_root

__all__ = ["Check", "Report", "exercise_path", "failure_check", "grade", "load", "main"]


def exercise_path(exercise: str, solutions: bool = False, root: Path | None = None) -> Path:
    """The learner's file (exercises/) or the reference (solutions/) for `exercise`."""
    if exercise not in EXERCISES:
        raise ValueError(f"unknown exercise {exercise!r}; known: {', '.join(sorted(EXERCISES))}")
    folder = (root or _find_root()) / ("solutions" if solutions else "exercises")
    path = folder / EXERCISES[exercise].filename
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (is this a checkout of the minitp repository?)")
    return path


def load(path: Path):
    """Import the file at `path` afresh, under a unique name, so edits are always seen
    and its functions travel to the ranks by value (they are not importable there)."""
    name = f"minitp_graded_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    cloudpickle.register_pickle_by_value(module)
    return module


def grade(exercise: str, solutions: bool = False, path: str | Path | None = None) -> Report:
    """Grade `exercise` ("ex01", …): the learner's file, or the solution with solutions=True."""
    file = Path(path) if path else exercise_path(exercise, solutions)
    spec = EXERCISES[exercise]
    report = Report(exercise, spec.title, _shown_path(file))
    try:
        module = load(file)
    except Exception as exc:  # noqa: BLE001 - a syntax error is the learner's to see, politely
        report.checks.append(Check("the file imports", False, f"{type(exc).__name__}: {exc}",
                                   hint="fix the error above, save the file, grade again"))
        return report
    try:
        missing = [name for name in _interface(exercise) if not hasattr(module, name)]
        if missing:  # renamed or deleted: say so, rather than let a check trip over it
            report.checks.extend(file_lacks(["the file defines the exercise's names"],
                                            ", ".join(missing)))
        else:
            report.checks.extend(spec.run(module))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        sys.modules.pop(module.__name__, None)
    return report


def _interface(exercise: str) -> list[str]:
    """The public functions and classes the exercise's solution defines: the names
    the learner's file must keep (exercises/ is generated from solutions/ with the
    same names). None to check where solutions/ is not at hand."""
    try:
        source = exercise_path(exercise, solutions=True).read_text()
    except FileNotFoundError:
        return []
    return [node.name for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")]


def _shown_path(file: Path) -> str:
    """The graded file as the learner knows it: relative to the repository if inside it."""
    try:
        return str(file.resolve().relative_to(_find_root()))
    except ValueError:
        return str(file)


def _find_root() -> Path:
    """The repository: the current directory or one above it with exercises/ and
    solutions/, else the checkout this package is installed from (editable install)."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "solutions").is_dir() and (folder / "exercises").is_dir():
            return folder
    return repo_root()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minitp.course.grade",
        description="Grade a minitp exercise on real processes.",
    )
    parser.add_argument("exercise", choices=sorted(EXERCISES))
    parser.add_argument("--solutions", action="store_true", help="grade the reference solution")
    parser.add_argument("--path", help="grade this file instead")
    args = parser.parse_args(argv)
    report = grade(args.exercise, solutions=args.solutions, path=args.path)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
