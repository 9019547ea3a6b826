"""The grader of ex21 (a ZeRO-3 unit, lesson 21) names the mistakes of the learner's part,
the memory of the gathered parameters (freed after the forward, refilled in place just
before the backward, freed again after it): every wrong answer here is the reference
solution with one mistake built in. That the solution passes every check and the
untouched exercise fails every one is tests/course/test_exercises.py's (parametrized
over every exercise, ex21 included); here the blanks' messages are checked word for word.

Budget: the wrong answers are graded at dp = 2 only (the grader's dp = 3 repeats
the same checks on more ranks; the solution is graded at both sizes)."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex21

FREE = "    full.untyped_storage().resize_(0)\n"
HOOK = "            y.register_hook(lambda grad: self.refill(full))\n"
COPY = "        full.data.copy_(values)"
FREE_AFTER_BACKWARD = "        (full,) = ctx.saved_tensors\n        free(full)\n"


@pytest.fixture
def dp2(monkeypatch):
    monkeypatch.setattr(ex21, "WORLD_SIZES", (2,))


def _by_kind(report):
    """The checks of dp = 2 by what they judge."""
    kinds = ("numbers", "after forward", "in backward", "collectives", "accumulation")
    return dict(zip(kinds, report.checks, strict=True))


def test_the_blank_says_what_is_not_written_and_gives_its_hint(dp2):
    report = mt.grade("ex21")
    first = report.checks[0]
    assert not any(c.passed for c in report.checks), str(report)
    assert first.detail == "Zero3Unit is not written yet", str(report)
    assert first.hint.startswith("after the forward this rank holds its shard only")


def test_a_blank_reached_only_in_backward_is_not_written_yet_either(tmp_path, dp2):
    # The forward and `free` written, the refill not: its NotImplementedError is raised by
    # a hook inside backward, and is still reported as a blank, not as a crash.
    blank = _variant(tmp_path, "ex21", (
        "        values = mt.comm.all_gather(self.shard.detach(), self.axis)\n",
        "        raise NotImplementedError('the refill')\n"))
    first = mt.grade("ex21", path=blank).checks[0]
    assert first.detail == "Zero3Unit is not written yet" and first.hint == "the refill"


def test_del_instead_of_freeing_the_storage_is_caught_after_the_forward(tmp_path, dp2):
    # Right numbers, right collectives: but autograd's saved views keep the whole vector.
    kept = _variant(tmp_path, "ex21", (FREE, "    del full\n"))
    checks = _by_kind(mt.grade("ex21", path=kept))
    assert checks["numbers"].passed and checks["collectives"].passed
    assert not checks["after forward"].passed and not checks["in backward"].passed
    assert ("1888 bytes of gathered parameters still held after unit 0's forward "
            "(the whole vector is 1888 bytes)") in checks["after forward"].detail
    assert "`del` drops only your name" in checks["after forward"].hint
    assert "never freed after its forward" in checks["in backward"].detail


def test_keeping_the_vector_for_backward_is_named_by_the_missing_refill(tmp_path, dp2):
    kept = _variant(tmp_path, "ex21", ("        free(full)\n        if y.requires_grad:",
                                       "        if False:"))
    checks = _by_kind(mt.grade("ex21", path=kept))
    assert checks["numbers"].passed
    assert [c.passed for c in checks.values()] == [True, False, False, False, True]
    assert "backward made no all_gather" in checks["collectives"].detail


@pytest.mark.parametrize("instead", [
    "            pass\n",  # freed after the forward, never refilled
    HOOK.replace("y.register", "x.register"),  # on the input: fires after the unit's backward
], ids=["never", "too late"])
def test_a_refill_missing_when_backward_reads_the_parameters_is_named(tmp_path, dp2, instead):
    edit = (HOOK, instead)
    wrong = _variant(tmp_path, "ex21", edit)
    checks = _by_kind(mt.grade("ex21", path=wrong))
    assert not checks["numbers"].passed and checks["after forward"].passed
    assert checks["numbers"].detail.endswith(
        "step 1, rank 0: backward read a saved view of the parameters while their storage "
        "held 0 bytes: nothing refilled it before the unit's backward"), str(checks)
    assert "when the gradient of the unit's output arrives" in checks["numbers"].hint
    assert checks["in backward"].detail == "not checked: backward failed (see above)"


def test_a_refill_into_a_new_tensor_is_named(tmp_path, dp2):
    # The gather happens, but the saved views still point at the freed storage.
    wrong = _variant(tmp_path, "ex21", (
        "        full.untyped_storage().resize_(values.numel() * values.element_size())\n", ""),
        (COPY, "        full.data = values"))
    numbers = _by_kind(mt.grade("ex21", path=wrong))["numbers"]
    assert ("backward gathered again, but a saved view of the parameters still saw a storage "
            "of 0 bytes" in numbers.detail), str(numbers)
    assert "full.data = ..." in numbers.hint


def test_a_refill_that_autograd_counts_as_a_write_is_named(tmp_path, dp2):
    wrong = _variant(tmp_path, "ex21", (COPY, "        with torch.no_grad():\n"
                                              "            full.copy_(values)"))
    numbers = _by_kind(mt.grade("ex21", path=wrong))["numbers"]
    assert numbers.detail.endswith("autograd refused a saved view of the parameters: the "
                                   "refill counted as an in-place write (its version went up)")
    assert "under torch.no_grad() too" in numbers.hint


def test_a_refill_of_other_values_is_named_by_the_right_forward(tmp_path, dp2):
    # The storage given its bytes back but never written: resize_ leaves garbage there,
    # here zeros (garbage that does not depend on the allocator).
    wrong = _variant(tmp_path, "ex21", (COPY, "        full.data.zero_()"))
    checks = _by_kind(mt.grade("ex21", path=wrong))
    assert not checks["numbers"].passed and checks["after forward"].passed
    assert ("the forward is right, so backward read other values than the forward's"
            in checks["numbers"].detail), str(checks)


def test_not_freeing_after_backward_is_caught_at_the_next_units_reduce_scatter(tmp_path, dp2):
    wrong = _variant(tmp_path, "ex21", (FREE_AFTER_BACKWARD, "        pass\n"))
    checks = _by_kind(mt.grade("ex21", path=wrong))
    assert [c.passed for c in checks.values()] == [True, True, False, True, False]
    assert checks["in backward"].detail.endswith(
        "unit 1 still held 1888 bytes while unit 0's gradient was reduce-scattered: not freed "
        "after its own backward")
    assert "GatherParams' backward" in checks["in backward"].hint


def test_refilling_too_soon_is_caught_while_the_later_unit_is_differentiated(tmp_path, dp2):
    # Every unit refilled when backward begins (on the first gradient any unit's output
    # gets): unit 0 is gathered while unit 1 is still being differentiated.
    wrong = _variant(tmp_path, "ex21", (
        HOOK, "            y.register_hook(lambda grad: [u.refill(f) for u, f in PENDING]"
              ".clear() or PENDING.clear())\n            PENDING.append((self, full))\n"),
        ("def free(full", "PENDING = []\n\n\ndef free(full"))
    checks = _by_kind(mt.grade("ex21", path=wrong))
    assert not checks["in backward"].passed, str(checks)
    assert checks["in backward"].detail.endswith(
        "unit 0 held 1888 bytes while unit 1's gradient was reduce-scattered: refilled before "
        "backward reached it")


def test_refilling_twice_is_named_by_the_count(tmp_path, dp2):
    wrong = _variant(tmp_path, "ex21", (HOOK, HOOK + HOOK))
    collectives = _by_kind(mt.grade("ex21", path=wrong))["collectives"]
    assert "backward made 4 all_gathers for 2 units: refill each unit once" in collectives.detail


def test_a_refill_of_the_units_latest_vector_fails_when_two_forwards_precede_the_backwards(
        tmp_path, dp2):
    # The vector kept on the unit, the hook refilling `self.full`: right while each forward
    # is followed by its own backward (every other check passes), but with two micro-batches'
    # forwards first, micro-batch 1's backward finds micro-batch 2's vector refilled, not its
    # own. The old grader (four checks a size) passed it.
    wrong = _variant(tmp_path, "ex21", (HOOK, "            self.full = full\n"
                                              "            y.register_hook(lambda grad: "
                                              "self.refill(self.full))\n"))
    checks = _by_kind(mt.grade("ex21", path=wrong))
    assert [c.passed for c in checks.values()] == [True, True, True, True, False], str(checks)
    assert checks["accumulation"].detail == (
        "rank 0, both forwards done: micro-batch 1's backward read a saved view of the "
        "parameters while their storage held 0 bytes: the refill did not fill the vector this "
        "forward gathered")
    assert "the one its hook captured, not one kept on the unit" in checks["accumulation"].hint


def test_a_gradient_overwritten_by_the_second_backward_is_named(tmp_path, dp2):
    # The shard's gradient cleared in GatherParams' backward: each backward alone is right
    # (the grader's steps clear .grad anyway), the sum of two is not.
    clear = FREE_AFTER_BACKWARD + "        ctx.unit.shard.grad = None\n"
    wrong = _variant(tmp_path, "ex21", (FREE_AFTER_BACKWARD, clear))
    checks = _by_kind(mt.grade("ex21", path=wrong))
    assert [c.passed for c in checks.values()] == [True, True, True, True, False], str(checks)
    assert checks["accumulation"].detail.startswith(
        "rank 0: after two backwards the shards' gradients are micro-batch 2's alone: the "
        "other backward's were overwritten, not accumulated"), checks["accumulation"].detail
    assert "set or clear .grad nowhere in the unit" in checks["accumulation"].hint
