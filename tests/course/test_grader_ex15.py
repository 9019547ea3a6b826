"""The grader of ex15 (a vision-language model's image tokens on a sequence-parallel rank,
lesson 15) names the usual slips: each wrong answer is the reference solution with one slip
built in, and each diagnosis has a test. That the untouched exercise fails every check is
tests/course/test_exercises.py's.

The checks, in order: 0 the placement's values, 1 its gradient, 2 encoder_grads_are_partial.
All in this process."""

import pytest
from test_exercises import _variant

import minitp as mt

CAT = "    return torch.cat([image[:, start:start + mine], x_local[:, mine:]], dim=1)"
MINE = "    mine = max(0, min(image.shape[1] - start, local))"
PARTIAL = '    return layout == "replicated" and sequence_parallel'
REFUSE = "        raise ValueError(f\"layout must be 'replicated' or 'tensor', got {layout!r}\")"

SLIPS = {  # the slip -> (edit, which checks pass, the check whose hint names it, its words)
    "local positions": (
        (CAT, "    return torch.cat([image[:, :mine], x_local[:, mine:]], dim=1)"),
        [False, False, True], 0, "the image at every rank's start"),
    "the whole image on rank 0 only": (
        (CAT, "    if rank:\n        return x_local\n"
              "    return torch.cat([image, x_local[:, image.shape[1]:]], dim=1)"),
        [False, False, True], 0, "the whole image on rank 0 only"),
    "a negative count past the image": (
        (MINE, "    mine = min(image.shape[1] - start, local)"),
        [False, False, True], 0, "negative count"),
    "a count not capped at the slice": (
        (MINE, "    mine = max(0, image.shape[1] - start)"),
        [False, False, True], 0, "overflowing: mine was not capped"),
    "the image cut off the graph": (
        (CAT, "    return torch.cat([image[:, start:start + mine].detach(), x_local[:, mine:]], "
              "dim=1)"),
        [True, False, True], 1, "no gradient reached the image tokens"),
    "replicated under SP not summed": (
        (PARTIAL, "    return False"), [True, True, False], 2,
        "the encoder's gradients not reduced over tp"),
    "the split encoder summed again": (
        (PARTIAL, "    return sequence_parallel"), [True, True, False], 2,
        "all-reduced before its backward"),
    "summed without SP": (
        (PARTIAL, '    return layout == "replicated"'), [True, True, False], 2,
        "without sequence parallelism every rank places all P image tokens"),
    "an unknown layout accepted": (
        (REFUSE, "        pass"), [True, True, False], 2, "raise ValueError"),
}


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_each_slip_is_named(tmp_path, slip):
    edit, passed, named, words = SLIPS[slip]
    report = mt.grade("ex15", path=_variant(tmp_path, "ex15", edit))
    assert [c.passed for c in report.checks] == passed, str(report)
    assert words in report.checks[named].hint, report.checks[named].hint
    for check in report.checks:  # the other slips' words are not said of this one
        others = [w for s, (_, _, n, w) in SLIPS.items() if s != slip and n == named]
        assert not any(w in check.hint for w in others), check.hint


def test_a_wrong_table_reveals_only_the_first_setting_that_failed(tmp_path):
    # Every one of the four settings answered wrong: the check names the first alone, with
    # its reason; the other three are neither shown nor counted (they would give the table
    # away after one attempt).
    edit = (PARTIAL, '    return not (layout == "replicated" and sequence_parallel)')
    partial = mt.grade("ex15", path=_variant(tmp_path, "ex15", edit)).checks[2]
    assert not partial.passed
    assert partial.detail == ("layout 'replicated', sequence_parallel=True: you said False, "
                              "minitp sums them over tp"), partial.detail
    assert "the encoder's gradients not reduced over tp" in partial.hint
    for layout, sp in (("tensor", True), ("replicated", False), ("tensor", False)):
        said = f"layout {layout!r}, sequence_parallel={sp}"
        assert said not in partial.detail and said not in partial.hint
