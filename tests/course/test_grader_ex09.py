"""The grader of ex09 (K/V heads under tensor parallelism, rotary positions under context
parallelism, lesson 09) names the usual slips: each wrong answer is the reference solution
with one slip built in, and each diagnosis has a test. That the solution passes every check
and the untouched exercise fails every one is tests/course/test_exercises.py's.

The checks, in order: 0 kv_heads_of, 1 sharing_ranks, 2 rope_positions. All in this
process."""

import pytest
from test_exercises import _variant

import minitp as mt

KV = "    return sorted({h // group for h in heads})"
SHARE = "    return [r for r in range(tp) if kv_heads_of(r, tp, n_head, n_kv) == mine]"
POS = "    return [k * chunk + j for k in (cp_rank, 2 * cp - 1 - cp_rank) for j in range(chunk)]"

SLIPS = {  # the slip -> (edit, which checks pass, the check whose hint names it, its words)
    "K/V heads split where tp is above them": (  # sharing_ranks, built on it, fails too
        (KV, "    return list(range(tp_rank * n_kv // tp, (tp_rank + 1) * n_kv // tp))"),
        [False, False, True], 0, "cannot be split over the ranks"),
    "every tp rank sums a replicated head": (
        (SHARE, "    return list(range(tp))"), [True, False, True], 1,
        "every tp rank is too many"),
    "a replicated head's copies never summed": (
        (SHARE, "    return [tp_rank]"), [True, False, True], 1, "the copies drift apart"),
    "local positions": (
        (POS, "    return list(range(length))"), [True, True, False], 2, "local positions"),
    "the contiguous split": (
        (POS, "    return list(range(cp_rank * length, (cp_rank + 1) * length))"),
        [True, True, False], 2, "contiguous split"),
}


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_each_slip_is_named(tmp_path, slip):
    edit, passed, named, words = SLIPS[slip]
    report = mt.grade("ex09", path=_variant(tmp_path, "ex09", edit))
    assert [c.passed for c in report.checks] == passed, str(report)
    assert words in report.checks[named].hint, report.checks[named].hint


GENERAL = {  # a wrong answer that is no named slip -> (edit, the check, words of its question)
    "kv_heads_of": ((KV, "    return [tp_rank]"), 0, "which K/V head does each of them read"),
    "sharing_ranks": ((SHARE, "    return [0]"), 1, "whose query heads add terms"),
    "rope_positions": ((POS, POS.replace("(cp_rank, 2 * cp - 1 - cp_rank)",
                                         "(2 * cp - 1 - cp_rank, cp_rank)")), 2,
                       "which two of the 2·cp chunks"),
}


@pytest.mark.parametrize("function", sorted(GENERAL))
def test_the_general_hints_ask_rather_than_give_the_formula(tmp_path, function):
    edit, check, words = GENERAL[function]
    hint = mt.grade("ex09", path=_variant(tmp_path, "ex09", edit)).checks[check].hint
    assert words in hint and hint.endswith("?"), hint
    assert "//" not in hint and "2·cp - 1" not in hint, hint


def test_the_exercise_text_gives_no_formula_away():
    text = mt.course.grading.exercise_path("ex09").read_text()
    for formula in ("h // (n_head // n_kv)", "2·cp - 1 - i", "2·cp−1−i", "chunks i and"):
        assert formula not in text, formula
