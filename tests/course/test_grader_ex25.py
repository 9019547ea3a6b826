"""The grader of ex25 (what each rank keeps of a Llama block under PyTorch's TP plan and
FSDP2, lesson 25) names the usual slips: each wrong answer is the reference solution with
one slip in each of the three checks (the grader judges each function on its own), graded
against one launch of 4 ranks. That the solution passes every check and the untouched
exercise fails every one is tests/course/test_exercises.py's."""

import pytest
from test_exercises import _variant

import minitp as mt

WRONG = {  # a wrong answer -> its edits and, per check, words of the hint it must get
    "the Embedding cut like a Linear, n // k rows, bytes split evenly": (
        [("Shard(0)  # rowwise: its input", "Shard(1)  # rowwise: its input"),
         ("block = math.ceil(local[dim] / ranks)", "block = local[dim] // ranks"),
         ("    placed = tp_placements()\n",
          "    return sum(math.prod(s) for s in SHAPES.values()) * itemsize // (dp * tp)\n")],
        ["token id", "drops the remainder", "not every parameter divides"]),
    "the norms split, a twice-sharded dim cut from the whole": (
        [("out[name] = Replicate()", "out[name] = Shard(0)"),
         ("block = math.ceil(local[dim] / ranks)", "block = math.ceil(shape[dim] / ranks)"),
         ("min(block, local[dim] - at * block)", "min(block, shape[dim] - at * block)")],
        ["splits the activations", "cuts the first one's piece", "norms' weights are whole"]),
}


@pytest.mark.parametrize("answer", sorted(WRONG))
def test_each_slip_is_named(tmp_path, answer):
    edits, named = WRONG[answer]
    report = mt.grade("ex25", path=_variant(tmp_path, "ex25", *edits))
    assert [c.passed for c in report.checks] == [False] * 3, str(report)
    for check, words in zip(report.checks, named, strict=True):
        assert words in check.hint, check.hint
