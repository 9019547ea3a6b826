"""The grader of ex14 (a ZeRO-3 unit, lesson 14) catches the shortcuts, each by name:
every wrong answer here is the reference solution with one shortcut built in.
That the solution passes every check and the untouched exercise fails every one is
tests/course/test_exercises.py's (parametrized over every exercise, ex14 included); here
the blank's message is checked word for word.

Budget: the wrong answers are graded at dp = 2 only (the grader's dp = 4 repeats
the same checks on more ranks; the solution is graded at both sizes)."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex14


@pytest.fixture
def dp2(monkeypatch):
    monkeypatch.setattr(ex14, "WORLD_SIZES", (2,))


def _by_kind(report):
    """The checks of dp = 2 by what they judge: values, shards, collectives, freed."""
    return dict(zip(("values", "shards", "collectives", "freed"), report.checks, strict=True))


def test_the_blank_says_what_is_not_written_and_gives_its_hint(dp2):
    report = mt.grade("ex14")
    first = report.checks[0]
    assert not any(c.passed for c in report.checks), str(report)
    assert first.detail == "Zero3Unit is not written yet", str(report)
    assert first.hint.startswith("this rank's slice of `flat`")


def test_keeping_the_gathered_parameters_for_backward_is_caught_twice(tmp_path, dp2):
    # Right numbers, but the whole vector lives from forward to backward: no memory saved.
    kept = _variant(tmp_path, "ex14",
                    ("        ctx.save_for_backward(x)\n",
                     "        ctx.save_for_backward(x)\n        ctx.full = full\n"),
                    ("full = mt.comm.all_gather(unit.shard.detach(), unit.axis)  # the same",
                     "full = ctx.full  # the same"))
    checks = _by_kind(mt.grade("ex14", path=kept))
    assert checks["values"].passed and checks["shards"].passed
    assert not checks["collectives"].passed and not checks["freed"].passed
    assert "backward made 0 all_gather(s) for 2 units" in checks["collectives"].detail
    assert "still alive after unit 0's forward" in checks["freed"].detail
    assert "1888 bytes" in checks["freed"].detail  # the whole padded vector, float64


def test_all_reducing_the_gradient_is_named_though_every_number_is_right(tmp_path, dp2):
    summed = _variant(tmp_path, "ex14", (
        "grad_shard = mt.comm.reduce_scatter(grad_full, unit.axis)",
        "grad_shard = mt.comm.all_reduce(grad_full, unit.axis).chunk(unit.axis.size)"
        "[unit.axis.rank]"))
    checks = _by_kind(mt.grade("ex14", path=summed))
    assert [c.passed for c in checks.values()] == [True, True, False, True]
    assert "made an all_reduce" in checks["collectives"].detail
    assert "reduce-scatter" in checks["collectives"].hint


def test_the_wrong_shard_is_named_by_the_values_it_holds(tmp_path, dp2):
    swapped = _variant(tmp_path, "ex14", ("start = axis.rank * self.shard_size",
                                  "start = (axis.size - 1 - axis.rank) * self.shard_size"))
    checks = _by_kind(mt.grade("ex14", path=swapped))
    assert not checks["values"].passed and not checks["shards"].passed
    assert checks["shards"].detail.endswith(
        "rank 0, unit 0: the shard holds values [118, 236); dp rank 0 owns values [0, 118)")
