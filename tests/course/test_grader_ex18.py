"""The grader of ex18 (a tensor-parallel decode step with its KV cache, lesson 18) names the
usual mistakes: each wrong answer is the reference solution with one mistake built in, and
each diagnosis has a test. That the solution passes every check is its lesson's cell; that
the untouched exercise fails every one, tests/course/test_exercises.py.

The checks at each t, in order: 0 (a) cache_heads, 1 (b) new_cache, 2 (c) decode_step's
outputs and cache, 3 (d) its communication. Budget: each test grades at t = 2 only (one
launch of two ranks)."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course import grading
from minitp.course.graders import ex18

ALL_REDUCE = "return mt.comm.all_reduce(part, axis)"
WRITE = "k_cache[:, :, pos:pos + 1] = k\n    v_cache[:, :, pos:pos + 1] = v"
READ = ("keys = k_cache[:, :, :pos + 1].repeat_interleave(group, dim=1)  # (B, H/t, pos+1, d)\n"
        "    values = v_cache[:, :, :pos + 1]")


@pytest.fixture(autouse=True)
def at_two(monkeypatch):
    monkeypatch.setattr(ex18, "WORLD_SIZES", (2,))


def _grade(tmp_path, *edits):
    return mt.grade("ex18", path=_variant(tmp_path, "ex18", *edits)).checks


def test_a_cache_kept_whole_on_every_rank(tmp_path):
    a, b, c, d = _grade(tmp_path, ("        share = n_kv_head // tp\n        return list(range("
                                   "rank * share, (rank + 1) * share))",
                                   "        return list(range(n_kv_head))"))
    assert a.detail == ("8 K/V heads, t=2, rank 0: every head listed: a cache kept whole on "
                        "every rank, where this rank's query heads read only [0, 1, 2, 3]")
    assert b.detail == ("rank 0: shape (2, 2, 6, 4), expected (2, 1, 6, 4): a cache kept "
                        "whole on every rank, 2x the memory this rank's heads need")
    assert c.passed and d.passed  # the grader's own shards and cache: (c) stands alone


def test_a_missing_all_reduce(tmp_path):
    a, b, c, d = _grade(tmp_path, (ALL_REDUCE, "return part"))
    assert a.passed and b.passed
    assert c.detail == ("rank 0 returned only its own heads' share of the output: the "
                        "all-reduce is missing")
    assert d.detail == "step 0 recorded nothing; expected one all-reduce"


def test_positions_off_by_one_written_a_slot_late(tmp_path):
    *_, c, d = _grade(tmp_path, (WRITE, WRITE.replace("pos:pos + 1", "pos + 1:pos + 2")))
    assert c.detail == "positions off by one: position p's K and V went to slot p + 1"
    assert d.passed


def test_positions_off_by_one_the_query_not_seeing_itself(tmp_path):
    *_, c, _ = _grade(tmp_path, (READ, READ.replace(":pos + 1]", ":pos]")))
    assert c.detail == "positions off by one: step 1 attended to slots 0..0, not to itself"


def test_the_exercise_states_the_problem_not_the_answer():
    # the learner reasons out which rank keeps which K/V heads and where the sum goes: the
    # file they open gives neither the head formulas nor the collective to call
    text = grading.exercise_path("ex18").read_text()
    for answer in ("r·K/t", "r·K // t", "rank * n_kv_head", "all_reduce", "all-reduce",
                   "copy of it", "K_r = 1"):
        assert answer not in text, answer
