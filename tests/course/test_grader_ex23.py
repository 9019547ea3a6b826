"""The grader of ex23 (FP8's amax groups, lesson 23) names the three mistakes the issue
names: a local scale, the wrong group, a forgotten backward scale. Each wrong answer is the
reference solution with one mistake built in; that the solution passes is its lesson's cell,
that the untouched exercise fails every check, tests/course/test_exercises.py.

The checks, in order: (a) shared_amax, (b) amax_groups, (c) gradient_gemms judged
alone, (d) the three together. Budget: one launch of 4 ranks per test."""

from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex23


def _grade(tmp_path, *edits):
    return mt.grade("ex23", path=_variant(tmp_path, "ex23", *edits)).checks


def test_a_local_scale_is_named_and_its_drift_measured(tmp_path):
    a, b, c, d = _grade(tmp_path, ("    for axis in axes:\n        amax = mt.comm.all_reduce(",
                                   "    for axis in ():\n        amax = mt.comm.all_reduce("))
    assert [a.passed, b.passed, c.passed, d.passed] == [False, True, True, False]
    assert a.detail == "over dp: this rank's own amax, not reduced: a local scale", a.detail
    assert "differs from one device's by" in d.detail and "not shared" in d.detail, d.detail


def test_the_wrong_group_for_the_weight_is_megatrons_bug(tmp_path):
    a, b, c, d = _grade(tmp_path, ('"weight": ("dp", "tp"),', '"weight": ("dp",),'))
    assert [a.passed, b.passed, c.passed, d.passed] == [True, False, True, False]
    assert b.detail.startswith("column layer, weight: ('dp',), expected ('dp', 'tp'): the "
                               "wrong group"), b.detail
    assert "Megatron-LM PR #442" in b.detail


def test_the_lessons_table_copied_misses_zero3s_dp():
    # lesson 23's amax_table prints "weight: tp" for weights whole on every dp rank; the
    # exercise's weights are ZeRO-3's pieces, cast before the gather: copying fails. Judged
    # in process: (b) is a table, no rank needed
    table = {(layer, sp): {role: tuple(a for a in axes if a != "cp") for lay, role, axes
                           in mt.fp8.amax_table("tensorwise", sequence_parallel=sp)
                           if lay == layer} for sp in (False, True) for layer in ("column", "row")}
    passed, detail, _ = ex23._judge_b({"b": table})
    assert not passed
    assert "weight: ('tp',), expected ('dp', 'tp'): dp holds other pieces of it here — " \
        "ZeRO-3" in detail, detail


def test_megatrons_one_group_over_tp_and_dp_passes_with_its_cost(tmp_path):
    # Megatron-LM reduces every amax over tp × dp: the extra ranks hold copies, so the
    # scales, and the step, are one device's; the grader says what it costs
    a, b, c, d = _grade(tmp_path, ('return {"input": ("dp", "tp") if split_input else ("dp",),',
                                   'return {"input": ("dp", "tp"),'),
                        ('"grad": ("dp", "tp") if layer == "column" else ("dp",)}',
                         '"grad": ("dp", "tp")}'))
    assert [a.passed, b.passed, c.passed, d.passed] == [True, True, True, True], b.detail
    assert "column input over tp; row grad over tp" in b.detail, b.detail
    assert "all-reduce over 4 ranks where 2 suffice" in b.detail, b.detail


def test_a_forgotten_backward_scale_is_named(tmp_path):
    a, b, c, d = _grade(tmp_path, (
        "    gq = quantize(grad, shared_amax(grad, axes), E5M2)\n",
        "    gq = grad\n"))
    assert [a.passed, b.passed, c.passed, d.passed] == [True, True, False, False]
    assert c.detail == ("without SP: the output gradient was never cast: the backward scale "
                        "is forgotten (the backward GEMMs read it in full precision)"), c.detail
    assert "E5M2" in c.hint
