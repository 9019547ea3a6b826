"""The grader of ex26 (expert parallelism's dispatch and combine, lesson 26) names the usual
mistakes: every wrong answer here is the reference solution with one mistake built in,
and each diagnosis the grader can give has a test. That the solution passes every check
and the untouched exercise fails every one is tests/course/test_exercises.py's
(parametrized over every exercise, ex26 included); here the blank's message is checked
word for word.

The checks, in order: 0 the split sizes, 1 the output, 2 the gradients (all three at
ep = 4, the function alone), 3 a training step of a MoE GPT on Mesh(dp=4, ep=2).

Budget: one launch of 4 ranks per grade; the training step is left out where the
function alone names the mistake (it is run for the solution, the blank, and once
here, for a mistake only gradients show)."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex26

EXCHANGE = "arrived = mt.comm.all_to_all(table, axis, [1] * ep, [1] * ep)"
SPLITS = "send, recv = table.sum(1).tolist(), arrived.sum(1).tolist()"
DISPATCH = 'got = all_to_all(rows, axis, send, recv, "dispatch")'
COMBINE = 'back = all_to_all(out[inverse(regroup)], axis, recv, send, "combine")'
UNPERMUTE = "weighted = back[inverse(order)] * gates[keep].unsqueeze(1)"
REFUSED = "not checked: the all-to-alls' split sizes do not match (see above)"


@pytest.fixture
def alone(monkeypatch):
    """The function alone: no training step."""
    monkeypatch.setattr(ex26, "STEP_CHECK", False)


def _grade(tmp_path, *edits):
    return mt.grade("ex26", path=_variant(tmp_path, "ex26", *edits)).checks


def _refused(checks):
    assert not checks[0].passed, checks
    assert [c.detail for c in checks[1:]] == [REFUSED] * 3, checks
    return checks[0]


def _output(checks):
    """The mistake shows in the output; the splits were right."""
    assert checks[0].passed and not checks[1].passed, checks
    assert checks[2].detail == "not checked: the output is wrong (see above)"
    return checks[1]


def test_the_blank_says_what_is_not_written_and_gives_its_hint():
    checks = mt.grade("ex26").checks
    assert not any(c.passed for c in checks), checks
    assert checks[0].detail == "dispatch_and_combine is not written yet"
    assert checks[0].hint.startswith("Which of your rows does each rank need, in what order")
    assert all(c.detail == "not checked: the run above failed" for c in checks[1:])


def test_per_expert_counts_used_as_per_rank_splits(tmp_path, alone):
    split = _refused(_grade(tmp_path, (SPLITS, "send, recv = counts.tolist(), "
                                               "arrived.flatten().tolist()")))
    assert split.detail == ("rank 0's dispatch had 8 send splits [0, 1, 0, 2, 2, 0, 1, 3]: "
                            "one per expert, where an all-to-all takes one per rank (4)")
    assert "one split per rank, the sum of its experts' counts" in split.hint


def test_the_counts_exchange_missing(tmp_path, alone):
    # The receiver assumes it gets what it sends: the ranks stop before the rows move.
    split = _refused(_grade(tmp_path, (EXCHANGE, "arrived = table")))
    assert split.detail == ("the counts exchange is missing: rank 0 assumed it receives what "
                            "it sends ([1, 2, 2, 4] rows); the ranks send it [1, 3, 0, 3]")
    assert split.hint.startswith("only the senders know what they send")


def test_the_combine_with_the_splits_not_swapped(tmp_path, alone):
    split = _refused(_grade(tmp_path, (COMBINE, COMBINE.replace("recv, send", "send, recv"))))
    assert split.detail == ("rank 0's combine used the dispatch's splits (send [1, 2, 2, 4], "
                            "recv [1, 3, 0, 3]): not swapped")


def test_unpermuted_by_order_not_by_its_inverse(tmp_path, alone):
    output = _output(_grade(tmp_path, (UNPERMUTE, UNPERMUTE.replace("inverse(order)",
                                                                    "order"))))
    assert output.detail.endswith(": un-permuted by order, not by its inverse"), output
    assert "assignment a is row inverse(order)[a]" in output.hint


def test_not_unpermuted_at_all(tmp_path, alone):
    output = _output(_grade(tmp_path, (UNPERMUTE, UNPERMUTE.replace("[inverse(order)]", ""))))
    assert output.detail.endswith(": not un-permuted"), output


def test_the_gates_forgotten(tmp_path, alone):
    output = _output(_grade(tmp_path, (UNPERMUTE, "weighted = back[inverse(order)]")))
    assert output.detail.endswith(": the gates are forgotten"), output


def test_the_gates_applied_twice(tmp_path, alone):
    output = _output(_grade(tmp_path, (UNPERMUTE, UNPERMUTE + "\n    weighted = weighted * "
                                                              "gates[keep].unsqueeze(1)")))
    assert output.detail.endswith(": the outputs were weighted by their gates twice"), output


def test_the_gates_applied_before_the_experts(tmp_path, alone):
    rows = "rows = tokens[token_of[order]]"
    output = _output(_grade(tmp_path, (rows, rows + " * gates[keep][order].unsqueeze(1)")))
    assert output.detail.endswith(": the rows were weighted by their gates before the "
                                  "experts"), output


def test_the_regroup_not_undone(tmp_path, alone):
    output = _output(_grade(tmp_path, (COMBINE, COMBINE.replace("out[inverse(regroup)]",
                                                                "out"))))
    assert output.detail.endswith(": the results went back grouped by expert: the regroup "
                                  "was not undone"), output


def test_the_regroup_applied_again_rather_than_undone(tmp_path, alone):
    # Rank 0's regroup undoes itself here; the grader names a rank whose does not.
    output = _output(_grade(tmp_path, (COMBINE, COMBINE.replace("inverse(regroup)",
                                                                "regroup"))))
    assert output.rank != 0
    assert output.detail.endswith(": the results were permuted by the regroup again, not "
                                  "by its inverse"), output


def test_the_experts_run_on_the_rows_as_they_arrived(tmp_path, alone):
    output = _output(_grade(tmp_path, ("expert_module(got[regroup]", "expert_module(got"),
                            (COMBINE, COMBINE.replace("out[inverse(regroup)]", "out"))))
    assert output.detail.endswith(": the experts ran on the rows as they arrived, grouped "
                                  "by source rank"), output


def test_rows_sent_by_the_all_to_all_that_carries_no_gradient(tmp_path):
    # The forward is right; the tokens get no gradient, and the training step shows it.
    checks = _grade(tmp_path, (DISPATCH, "got = mt.comm.all_to_all(rows, axis, send, recv)"))
    assert [c.passed for c in checks] == [True, True, False, False], checks
    assert checks[2].detail == "rank 0: tokens.grad is None"
    assert "not mt.comm.all_to_all" in checks[2].hint
    assert checks[3].detail.startswith("after the step, "), checks[3]


def test_the_exercise_text_gives_no_step_away():
    text = mt.course.grading.exercise_path("ex26").read_text()
    for step in ("1. **permute**", "source_to_expert_major", "index_add over", "counts.view",
                 "splits swapped", "row j is what you send"):
        assert step not in text, step


def test_a_dispatch_in_another_order_is_asked_about(tmp_path, alone):
    # Rows sent in token order, not grouped by expert: no usual mistake's shape, a question.
    output = _output(_grade(tmp_path, ("rows = tokens[token_of[order]]",
                                       "rows = tokens[token_of]")))
    assert output.hint == ("which of this rank's rows does each rank need, and in what "
                           "order?"), output
