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
import minitp.course.graders
from minitp.course import grading
from minitp.course.graders import EXERCISES
from minitp.course.make_exercises import blank_out, expected_exercises
from minitp.course.paths import repo_root


def test_exercises_are_generated_from_solutions():
    expected = expected_exercises()
    assert {p.name for p in expected} == {e.filename for e in EXERCISES.values()}
    for path, text in expected.items():
        regenerate = "run python -m minitp.course.make_exercises"
        assert path.exists(), f"{path} missing: {regenerate}"
        assert path.read_text() == text, f"{path} is stale: {regenerate}"


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


# That every reference solution passes every check is asserted once, in its lesson's cell
# `mt.grade("exNN", solutions=True)` under nbval (tests/course/test_course_order.py makes sure
# each lesson has that cell): grading each solution here too took the suite ~15 s more.


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
    """graders/ sits below minitp.course.grading, which mt.grade imports: a grader that imports
    `minitp` itself (``import minitp as mt``, ``from minitp import Mesh``) or the grader
    would close a cycle. Submodules (``from minitp import comm``) are fine."""
    for path in Path(minitp.course.graders.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                here = "minitp.course.graders".split(".")
                package = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
                module = ".".join(filter(None, [package, node.module]))
                imported = ([f"minitp.{alias.name}" for alias in node.names]
                            if module == "minitp" else [module])
            else:
                continue
            for name in imported:
                facade = name == "minitp" or (name.startswith("minitp.")
                                              and importlib.util.find_spec(name) is None)
                assert not facade, f"{path.name}:{node.lineno} imports {name} from the facade"
                assert name != "minitp.course.grading", (
                    f"{path.name}:{node.lineno} imports the grader")


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
    from minitp.course.graders import ex01

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
    # ex20's grader runs no ranks: the command line is what is tested here (every grader's
    # solution passes in its lesson's cell), in 2 s rather than ex01's 6
    root = repo_root()
    good = subprocess.run([sys.executable, "-m", "minitp.course.grade", "ex20", "--solutions"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "3/3 checks passed" in good.stdout
    blank = subprocess.run([sys.executable, "-m", "minitp.course.grade", "ex20"],
                           cwd=root, capture_output=True, text=True, timeout=120)
    assert blank.returncode == 1 and "not written yet" in blank.stdout
    check = subprocess.run([sys.executable, "-m", "minitp.course.make_exercises", "--check"],
                           cwd=root, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout


def _variant(tmp_path, exercise, *edits):
    """The reference solution of `exercise` with `edits` (old, new) made: a learner's mistake."""
    source = grading.exercise_path(exercise, solutions=True).read_text()
    for old, new in edits:
        assert old in source, f"the solution no longer contains {old!r}: update this test"
        source = source.replace(old, new)
    path = tmp_path / f"{exercise}_variant.py"
    path.write_text(source)
    return path


def test_ex07_reports_a_deadlock_by_who_waits_for_what(tmp_path, monkeypatch):
    # Fewer forwards ahead on the early stages than on the late ones: stage 0 waits for
    # a gradient while stage 1 waits for the activation stage 0 has not sent.
    from minitp.course.graders import ex11

    monkeypatch.setattr(ex11, "TIMEOUT", 1.0)
    wrong = _variant(tmp_path, "ex11", ("warmup = min(stage.p - stage.r - 1, m)",
                                        "warmup = min(stage.r, m)"))
    report = mt.grade("ex11", path=wrong)
    first = report.checks[0]
    assert not any(c.passed for c in report.checks), str(report)
    assert first.detail.startswith("deadlock"), str(report)
    assert "rank 0 waits for a gradient from rank 1" in first.detail
    assert "rank 1 waits for an activation from rank 0" in first.detail
    assert all("deadlocked" in c.detail for c in report.checks[1:])


def test_ex07_reports_activations_kept_past_their_backward_and_after_the_step(tmp_path):
    # The 1F1B order and the numbers are right; only the keeping is wrong.
    kept = _variant(tmp_path, "ex11", ("x, out = held.pop(i)", "x, out = held[i]"))
    report = mt.grade("ex11", path=kept)
    failed = [c for c in report.checks if not c.passed]
    assert [c.name for c in failed] == [n for n in ex11_names() if "held" in n], str(report)
    assert "after its backward" in failed[0].detail and failed[0].rank is not None
    leak = _variant(tmp_path, "ex11", ("x, out = held.pop(i)", "x, out = held[i]"),
                    ("    held = {}", "    held = stage.saved = {}"))
    report = mt.grade("ex11", path=leak)
    failed = [c for c in report.checks if not c.passed]
    assert len(failed) == 2 and all("a leak" in c.detail for c in failed), str(report)


def ex11_names():
    from minitp.course.graders import ex11

    return [name for m in ex11.MS for name in ex11._names(m)]


def test_ex08_fails_a_sync_that_waits_for_backward_to_end(tmp_path):
    # Correct sums, the right buckets, but every all-reduce after backward: no overlap.
    late = _variant(
        tmp_path, "ex13",
        ("        if self.arrived[k] == len(self.buckets[k]):", "        if False:"),
        ("            flat = self.pending.pop(k).wait()",
         "            flat = mt.comm.all_reduce(torch.cat([q.grad.reshape(-1) for q in bucket]), "
         "self.axis)"))
    report = mt.grade("ex13", path=late)
    assert [c.passed for c in report.checks] == [True, True, False] * 2, str(report)
    assert "started after backward ended" in report.checks[2].detail


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_a_file_without_the_exercises_names_is_told_which(exercise, tmp_path):
    """A renamed or deleted function is one failed check naming it, before any check
    runs, for every exercise (not an AttributeError from deep inside a grader)."""
    solution = ast.parse(grading.exercise_path(exercise, solutions=True).read_text())
    public = [n.name for n in solution.body
              if isinstance(n, ast.FunctionDef | ast.ClassDef) and not n.name.startswith("_")]
    empty = tmp_path / "empty.py"
    empty.write_text("import torch\n")
    report = mt.grade(exercise, path=empty)
    assert [(c.name, c.passed) for c in report.checks] == [
        ("the file defines the exercise's names", False)], str(report)
    assert report.checks[0].detail == f"the file has no {', '.join(public)}"
