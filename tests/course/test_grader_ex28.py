"""The grader of ex28 (find the bug, lesson 28) catches each named mistake and never names
the learner's bug in a failing report: a wrong key (told only how the bug it names would
show), a fix for another bug (its run on 4 ranks still departs), a fix not on the list
and a key not in the museum (nothing runs). That the solution passes is its lesson's cell;
that the untouched exercise fails politely, tests/course/test_exercises.py's.

The names used draw a bug cheap to run: "learner 9" draws `muon_row_shard` (a probe: one
launch, no GPT), "learner 8" the hang (its checks here run nothing)."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.labs.find_the_bug import yours
from minitp.debug import museum

ROW_SHARD, HANG = "learner 9", "learner 8"
SOLUTION_KEY = 'return "packed_rope_under_cp"'
SOLUTION_FIX = ('return ("rotate each row by its own positions (restarting at its documents), '
                'each cp "\n            "rank\'s chunks of them")')


def _graded(tmp_path, name, key, fix):
    edits = [('NAME = "learner"', f'NAME = "{name}"'), (SOLUTION_KEY, f"return {key!r}"),
             (SOLUTION_FIX, f"return {fix!r}")]
    return mt.grade("ex28", path=_variant(tmp_path, "ex28", *edits))


def _said(report) -> str:
    return " ".join(f"{c.detail} {c.hint}" for c in report.checks)


def test_the_names_draw_the_bugs_this_file_relies_on():
    assert (yours(ROW_SHARD), yours(HANG)) == ("muon_row_shard", "uneven_steps_hang")


def test_the_right_bug_with_another_bugs_fix_still_departs_on_the_ranks(tmp_path):
    wrong_fix = museum.MUSEUM["muon_partial_gradient"].fix
    report = _graded(tmp_path, ROW_SHARD, "muon_row_shard", wrong_fix)
    diagnosis, fix = report.checks
    assert diagnosis.passed and not fix.passed, str(report)
    assert "still departs" in fix.detail and fix.max_error > 1e-3, str(report)
    assert "another bug" in fix.hint


@pytest.mark.parametrize("said, words", [
    ("muon_partial_gradient", "would show as"),  # the same look (a drift): its symptom
    ("uneven_steps_hang", "hangs; your run drifts"),  # another look: that alone
])
def test_a_wrong_key_is_told_how_its_bug_shows_never_which_bug_the_run_holds(tmp_path, said,
                                                                             words):
    report = _graded(tmp_path, ROW_SHARD, said, "not a fix")
    diagnosis, fix = report.checks
    assert not diagnosis.passed and words in diagnosis.hint, str(report)
    assert not fix.passed and "is not one of" in fix.detail, str(report)  # and nothing ran
    assert "muon_row_shard" not in _said(report) and "5961" not in _said(report)


def test_a_key_not_in_the_museum_and_a_hang_run_are_not_revealed(tmp_path):
    report = _graded(tmp_path, HANG, "the_optimizer", "not a fix")
    assert [c.passed for c in report.checks] == [False, False], str(report)
    assert "is not a museum key" in report.checks[0].detail
    assert "uneven_steps_hang" not in report.checks[0].detail
    assert "38174" not in _said(report) and "hang" not in report.checks[1].hint
