"""The grader of ex22 (DTensor placements of a tensor-parallel MLP, lesson 22) names the
usual slips: each wrong answer is the reference solution with slips built in, graded on
2 ranks. To keep to one launch per wrong answer, each answer carries three slips in three
different checks (the grader judges each group of tensors on its own): every slip is
named by its check's hint. That the solution passes every check and the untouched exercise
fails every one is tests/course/test_exercises.py's."""

import pytest
from test_exercises import _variant

import minitp as mt

OUTSIDE = "    outside = Shard(0) if sp else Replicate()\n"
FC1 = '"fc1.weight": Shard(0),'
FC2 = '"fc2.weight": Shard(1),'
PARTIAL = '"y_partial": Partial(),'
BIAS = '"fc2.bias": Replicate(),'
OUT = '"y": outside}'

WRONG = {  # a wrong answer -> its edits and, per failed check, words of the hint
    "column dim, Replicate for Partial, SP's input whole": (
        [(FC1, '"fc1.weight": Shard(1),'), (PARTIAL, '"y_partial": Replicate(),'),
         (OUTSIDE, OUTSIDE + "    x = Replicate()\n"),
         ('return {"x": outside,', 'return {"x": x,')],
        {0: "out_features, in_features", 1: "Partial()", 3: "1/tp of the token rows"}),
    "row dim, SP on the features, a sum left pending": (
        [(FC2, '"fc2.weight": Shard(0),'),
         (OUTSIDE, "    outside = Shard(1) if sp else Replicate()\n"),
         (OUT, '"y": outside if sp else Partial()}')],
        {1: "dim 1, not 0", 2: "all-reduce has taken the sum", 3: "splits the tokens"}),
    "the bias a term, SP's output whole": (
        [(BIAS, '"fc2.bias": Partial(),'), (OUT, '"y": Replicate()}')],
        {1: "added tp times", 3: "reduce-scatter"}),
}


@pytest.mark.parametrize("answer", sorted(WRONG))
def test_each_slip_is_named(tmp_path, answer):
    edits, named = WRONG[answer]
    report = mt.grade("ex22", path=_variant(tmp_path, "ex22", *edits))
    failed = {i for i, c in enumerate(report.checks) if not c.passed}
    assert failed == set(named) | {4}, str(report)  # and the DTensor run fails with them
    for check, words in named.items():
        assert words in report.checks[check].hint, report.checks[check].hint
