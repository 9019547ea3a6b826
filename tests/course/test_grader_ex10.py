"""The grader of ex10 (Ulysses' two all-to-alls and grouped-query K/V before them, lesson 10)
names the usual mistakes: each wrong answer is the reference solution with one mistake
built in, and each diagnosis has a test. That the solution passes every check is its
lesson's cell; that the untouched exercise fails every one, tests/course/test_exercises.py.

The checks at each cp, in order: 0 (a) heads_to_sequence, 1 (b) sequence_to_heads, 2 (c)
kv_for_all_to_all, 3 (d) the three in a grouped-query GPT. Budget: each test grades at the
one cp where its mistake shows (one launch)."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex10

SCATTER = "parts = torch.stack(x.chunk(cp, dim=1))  # row k: head group k, for rank k"
PLACE = "whole[j], whole[2 * cp - 1 - j] = row.chunk(2, dim=2)"
BACK = "torch.cat([chunks[j], chunks[2 * cp - 1 - j]], dim=2)"
GATHER = "return torch.cat(got.unbind(0), dim=1)"
SPLIT = "    if n_kv % cp == 0:\n        return k\n"
WIDEN = "return k.repeat_interleave(cp // n_kv, dim=1)"


@pytest.fixture
def at(monkeypatch):
    def one_size(cp):
        monkeypatch.setattr(ex10, "WORLD_SIZES", (cp,))
    return one_size


def _grade(tmp_path, *edits):
    return mt.grade("ex10", path=_variant(tmp_path, "ex10", *edits)).checks


def _only(checks, failed):
    """Exactly the checks `failed` failed, and (d) was skipped for them."""
    assert [c.passed for c in checks[:3]] == [i not in failed for i in range(3)], checks
    assert checks[3].detail == ex10.SKIPPED, checks[3]
    return [checks[i] for i in failed]


def test_the_sequence_split_where_the_heads_should_be(tmp_path, at):
    at(2)
    (a,) = _only(_grade(tmp_path, (SCATTER, SCATTER.replace("dim=1", "dim=2"))), [0])
    assert a.detail == ("rank 0 returned shape (2, 8, 6, 4), expected (2, 4, 12, 4): every "
                        "head is still here: the sequence was split where the heads should be")
    assert "which dimension do you cut into cp parts?" in a.hint


def test_the_positions_left_in_the_order_they_arrived(tmp_path, at):
    at(4)
    (a,) = _only(_grade(tmp_path, (PLACE, "whole[2 * j], whole[2 * j + 1] = row.chunk(2, "
                                          "dim=2)")), [0])
    assert a.detail == ("rank 0: the positions are in the order they arrived, chunks "
                        "[0, 7, 1, 6, 2, 5, 3, 4], not in the sequence's order")
    assert a.hint.startswith("where in the sequence do rank j's two chunks stand?")


def test_the_reverse_sent_back_as_a_contiguous_split(tmp_path, at):
    at(2)
    (b,) = _only(_grade(tmp_path, (BACK, "torch.cat([chunks[2 * j], chunks[2 * j + 1]], "
                                         "dim=2)")), [1])
    assert b.detail == ("rank 0 got positions 0..5 back, a contiguous split: the reverse "
                        "does not undo (a)")
    assert b.hint.endswith("?")


def test_the_reverse_that_does_not_gather_the_heads_back(tmp_path, at):
    at(2)
    (b,) = _only(_grade(tmp_path, (GATHER, GATHER.replace("dim=1", "dim=2"))), [1])
    assert b.detail == ("rank 0 returned shape (2, 4, 12, 4), expected (2, 8, 6, 4): not "
                        "every head came back, so this does not undo (a)")


def test_gqa_kv_heads_handed_over_like_query_heads(tmp_path, at):
    at(2)
    (c,) = _only(_grade(tmp_path, (SPLIT, "    if True:\n        return k\n")), [2])
    assert c.detail == ("1 K/V heads, cp=2: returned K unchanged, as if its heads were query "
                        "heads: 2 ranks cannot split 1")
    assert c.hint == ex10.HINT_C


def test_gqa_copies_tiled_rather_than_side_by_side(tmp_path, at):
    at(4)  # at cp 2 the one K/V head's copies are the same either way
    (c,) = _only(_grade(tmp_path, (WIDEN, "return k.repeat(1, cp // n_kv, 1, 1)")), [2])
    assert c.detail == "2 K/V heads, cp=4: the copies are tiled: rank r would get K/V head r mod 2"


def test_gqa_kv_heads_copied_where_cp_splits_them(tmp_path, at):
    at(2)
    (c,) = _only(_grade(tmp_path, (SPLIT, "    if n_kv % cp == 0:\n        return "
                                          "k.repeat_interleave(2, dim=1)\n")), [2])
    assert c.detail.startswith("8 K/V heads, cp=2: cp divides them, so the all-to-all splits")
