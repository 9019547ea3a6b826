"""The exercise machinery: exercises/ is generated from solutions/, every solution
passes its grader, every untouched blank fails every check politely (no crash, no hang)."""

import ast
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

import minitp as mt
import minitp.checks
from minitp._paths import repo_root
from minitp.checks import EXERCISES
from minitp.make_exercises import blank_out, expected_exercises


def test_exercises_are_generated_from_solutions():
    expected = expected_exercises()
    assert {p.name for p in expected} == {e.filename for e in EXERCISES.values()}
    for path, text in expected.items():
        assert path.exists(), f"{path} missing: run python -m minitp.make_exercises"
        assert path.read_text() == text, f"{path} is stale: run python -m minitp.make_exercises"


def test_blank_out_replaces_each_block_with_its_hint():
    source = (
        "def f(x):\n"
        "    y = 1\n"
        "    # BEGIN SOLUTION\n"
        "    # hint: add one\n"
        "    # hint: to x\n"
        "    return x + y\n"
        "    # END SOLUTION\n"
    )
    blank = blank_out(source)
    assert "return x + y" not in blank
    assert "raise NotImplementedError(" in blank and "'add one to x'" in blank
    namespace = {}
    exec(blank, namespace)
    with pytest.raises(NotImplementedError, match="add one to x"):
        namespace["f"](1)


@pytest.mark.parametrize("broken", [
    "    # BEGIN SOLUTION\n    x = 1\n",
    "    x = 1\n    # END SOLUTION\n",
    "    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n",
])
def test_blank_out_rejects_unbalanced_markers(broken):
    with pytest.raises(ValueError):
        blank_out(broken)


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_solution_passes_every_check(exercise):
    report = mt.grade(exercise, solutions=True)
    assert report.checks, "an exercise without checks cannot fail"
    assert report.passed, str(report)
    assert "All checks passed" in str(report)


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_untouched_exercise_fails_every_check_politely(exercise):
    started = time.perf_counter()
    report = mt.grade(exercise)
    assert time.perf_counter() - started < 30, "a blank must fail fast, not wait for timeouts"
    assert report.checks and not any(c.passed for c in report.checks), str(report)
    text = str(report)
    assert "not written yet" in text and "hint:" in text
    assert "Traceback" not in text


def test_the_checks_import_neither_the_facade_nor_the_grader():
    """checks/ sits below minitp.grading, which the facade imports: a check that imports
    `minitp` itself (``import minitp as mt``, ``from minitp import Mesh``) or the grader
    would close a cycle. Submodules (``from minitp import comm``) are fine."""
    for path in Path(minitp.checks.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                package = ["minitp.checks", "minitp"][node.level - 1] if node.level else ""
                module = ".".join(filter(None, [package, node.module]))
                imported = ([f"minitp.{alias.name}" for alias in node.names]
                            if module == "minitp" else [module])
            else:
                continue
            for name in imported:
                facade = name == "minitp" or (name.startswith("minitp.")
                                              and importlib.util.find_spec(name) is None)
                assert not facade, f"{path.name}:{node.lineno} imports {name} from the facade"
                assert name != "minitp.grading", f"{path.name}:{node.lineno} imports the grader"


def test_grader_reports_a_wrong_answer_with_rank_and_error(tmp_path):
    wrong = tmp_path / "ex01_wrong.py"
    wrong.write_text(
        "import minitp as mt\n"
        "def ring_all_reduce(x, axis):\n"
        "    return mt.comm.all_reduce(x, axis) * 2\n"
    )
    report = mt.grade("ex01", path=wrong)
    assert not report.passed
    equal = report.checks[0]
    assert not equal.passed and equal.rank is not None and equal.max_error > 0.1
    assert "largest error" in equal.detail
    steps = report.checks[1]
    assert not steps.passed and "all_reduce" in steps.detail


def test_grader_turns_a_deadlock_into_a_timeout_report(tmp_path, monkeypatch):
    stuck = tmp_path / "ex01_stuck.py"
    stuck.write_text(
        "import torch, minitp as mt\n"
        "def ring_all_reduce(x, axis):\n"
        "    if axis.rank == 0:\n"
        "        buffer = torch.empty_like(x)\n"
        "        mt.comm.sendrecv(x, axis.next, buffer, axis.prev)\n"
        "    return x\n"
    )
    from minitp.checks import ex01

    original = ex01.launch

    def quick_launch(*args, **kwargs):
        kwargs["timeout"] = 2.0
        return original(*args, **kwargs)

    monkeypatch.setattr(ex01, "launch", quick_launch)
    report = mt.grade("ex01", path=stuck)
    assert not report.passed
    assert "never met" in report.checks[0].detail
    assert all("not run" in c.detail for c in report.checks[2:])


def test_grader_reports_a_syntax_error_without_crashing(tmp_path):
    broken = tmp_path / "ex01_broken.py"
    broken.write_text("def ring_all_reduce(x, axis)\n    return x\n")
    report = mt.grade("ex01", path=broken)
    assert not report.passed and "SyntaxError" in report.checks[0].detail


def test_command_line_exit_codes():
    root = repo_root()
    good = subprocess.run([sys.executable, "-m", "minitp.grade", "ex01", "--solutions"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "6/6 checks passed" in good.stdout
    blank = subprocess.run([sys.executable, "-m", "minitp.grade", "ex01"],
                           cwd=root, capture_output=True, text=True, timeout=120)
    assert blank.returncode == 1 and "not written yet" in blank.stdout
    check = subprocess.run([sys.executable, "-m", "minitp.make_exercises", "--check"],
                           cwd=root, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout
