"""The grader of ex27 (latent attention's tensor-parallel plan, lesson 27) names the usual
mistakes: each wrong answer is the reference solution with one mistake built in. (a) and
(b) are judged against the library's plan in this process (the run on ranks left out:
`RANKS` off); one test runs the ranks, for the mistake only they show as drift: W^KR's
sum left out. That the solution passes every check (on ranks) is lesson 27's cell, and
that the untouched exercise fails every one tests/course/test_exercises.py's."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex27

SPLIT = '"kv_down": "replicated"'
UP = '"kv_up": "column"'
PROJ = '"proj": "row"'
ROPE = '"k_rope": "replicated"'
NORM = '"q_norm": "replicated"'
SUMS = '{"q_down", "q_norm", "kv_down", "kv_norm", "k_rope"}'


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setattr(ex27, "RANKS", False)


def _checks(tmp_path, *edits):
    return mt.grade("ex27", path=_variant(tmp_path, "ex27", *edits)).checks


@pytest.mark.parametrize("edit, detail, words", [
    ((SPLIT, '"kv_down": "column"'), "kv_down as column; the plan makes it replicated",
     "the WHOLE latent"),
    ((UP, '"kv_up": "replicated"'), "kv_up as replicated; the plan makes it column",
     "tp times the work"),
    ((UP, '"kv_up": "row"'), "kv_up as row; the plan makes it column", "partial sum"),
    ((PROJ, '"proj": "column"'), "proj as column; the plan makes it row", "row-parallel"),
    ((ROPE, '"k_rope": "column"'), "k_rope as column; the plan makes it replicated",
     "ONE key"),
    ((NORM, '"q_norm": "column"'), "q_norm as column; the plan makes it replicated",
     "root mean square"),
])
def test_each_split_mistake_is_named(tmp_path, in_process, edit, detail, words):
    split, sums, _ = _checks(tmp_path, edit)
    assert not split.passed and split.detail == detail and words in split.hint, split
    assert sums.passed, sums


@pytest.mark.parametrize("sums, detail, words", [
    ('{"q_down", "q_norm", "kv_down", "kv_norm"}', "k_rope's gradient is left partial",
     "torchtitan PR #1373"),
    ('{"q_down", "q_norm", "k_rope"}', "kv_down, kv_norm: left partial", "no f of their own"),
    ('{"q_down", "q_norm", "kv_down", "kv_norm", "k_rope", "kv_up"}',
     "kv_up: summed, though split", "OTHER ranks' blocks"),
])
def test_each_sum_mistake_is_named(tmp_path, in_process, sums, detail, words):
    split, check, ranks = _checks(tmp_path, (SUMS, sums))
    assert split.passed and not check.passed and not ranks.passed, (check, ranks)
    assert check.detail == detail and words in check.hint, check


@pytest.mark.ranks
def test_the_unsummed_rotary_key_drifts_on_the_ranks(tmp_path):
    checks = _checks(tmp_path, (SUMS, '{"q_down", "q_norm", "kv_down", "kv_norm"}'))
    ranks = checks[2]
    assert [c.passed for c in checks] == [True, False, False], checks
    assert ".k_rope.weight differs from one device's" in ranks.detail, ranks.detail
    assert "the two ranks' copies of W^KR differ" in ranks.detail, ranks.detail
    assert "torchtitan PR #1373" in ranks.hint
