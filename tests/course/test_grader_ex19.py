"""The grader of ex19 (the refit plan of one weight from (pp 2, tp 2) to tp 4, lesson 19) names
the usual mistakes: each wrong answer is the reference solution with one mistake built in,
and each diagnosis has a test. That the solution passes every check is its lesson's cell;
that the untouched exercise fails every one, tests/course/test_exercises.py.

The checks, in order: 0 the column-parallel weights, 1 the row-parallel ones, 2 the
library's plan. All in this process (no ranks): about a second in all."""

from test_exercises import _variant

import minitp as mt
from minitp.course import grading

SOURCE = "plan.append((stage * TP + t, target, rows, cols))"
OVERLAP = "a, b = max(lo, t * size // TP), min(hi, (t + 1) * size // TP)"
SIZE = "size = shape[split_dim]"
BLOCK = "rows, cols = ((a, b), whole) if split_dim == 0 else (whole, (a, b))"


def _grade(tmp_path, *edits):
    return mt.grade("ex19", path=_variant(tmp_path, "ex19", *edits)).checks


def test_a_pipeline_stage_forgotten(tmp_path):
    column, row, library = _grade(tmp_path, (SOURCE, "plan.append((t, target, rows, cols))"))
    assert column.detail == ("layer 3's MLP first matrix: rank 0 sends rank 0 rows 0:8, cols "
                             "0:8, but layer 3 lives on stage 1 (ranks 2, 3): a pipeline stage "
                             "forgotten, rank 0 holds none of it")
    assert "pipeline stage forgotten" in row.detail and not library.passed


def test_a_row_parallel_weight_split_on_the_wrong_dimension(tmp_path):
    column, row, _ = _grade(tmp_path, (SIZE, "size = shape[0]"),
                            (BLOCK, "rows, cols = (a, b), (0, shape[1])"))
    assert column.passed  # split on dim 0 is right for it
    assert row.detail == ("layer 1's MLP second matrix, row-parallel (split on dim 1, its "
                          "input features): rank 0 gets slice 0 of dim 0, where serving splits "
                          "dim 1: the weight split on the wrong dimension")


def test_a_shard_sent_twice(tmp_path):
    column, row, _ = _grade(tmp_path, (OVERLAP, "a, b = lo, hi"))
    assert column.detail == ("layer 0's MLP first matrix: rank 0 receives some elements 2 times "
                             "(pieces from ranks [0, 1]): a shard sent twice")
    assert "a shard sent twice" in row.detail


def test_what_a_rank_keeps_must_be_listed(tmp_path):
    column, *_ = _grade(tmp_path, ("if a < b:", "if a < b and stage * TP + t != target:"))
    assert column.detail == ("layer 0's MLP first matrix: rank 0 never gets part of its slice "
                             "(what it already holds counts only when listed, with source == "
                             "target)")


def test_a_piece_from_the_rank_holding_the_other_half(tmp_path):
    column, *_ = _grade(tmp_path, (SOURCE, "plan.append((stage * TP + 1 - t, target, rows, "
                                           "cols))"))
    assert column.detail == ("layer 0's MLP first matrix: rank 1 sends rank 0 rows 0:8, cols "
                             "0:8, which it does not hold: it holds the tp-2 slice 1 of stage 0")


def test_many_pieces_for_one_pair_are_one_message_too_many(tmp_path):
    column, row, library = _grade(tmp_path, (SOURCE, "plan.extend((stage * TP + t, target, "
                                                     "(i, i + 1), cols) for i in range(*rows))"))
    assert column.passed and row.passed  # right, element by element
    assert library.detail == "layer 0's MLP first matrix: rank 0 gives rank 0 8 pieces"
    assert "one message per (source, target) pair" in library.hint


def test_an_answer_of_the_wrong_form_is_told_the_form(tmp_path):
    column, row, library = _grade(tmp_path, ("    return plan\n", "    return {}\n"))
    assert column.detail == "layer 0's MLP first matrix: returned dict"
    assert "(source, target, (row_start, row_stop)" in column.hint
    assert library.detail == "not checked: the plan above is not well formed"


def test_the_exercise_states_the_problem_not_the_answer():
    text = grading.exercise_path("ex19").read_text()
    for answer in ("layer // (n_layer", "stage * TP + t", "max(lo", "size // SERVE_TP"):
        assert answer not in text, answer
