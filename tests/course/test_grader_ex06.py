"""The grader of ex06 (SUMMA's backward, the lesson on 2D tensor parallelism) names each
usual mistake: every wrong answer here is the reference solution with one mistake built
in. That the solution passes and the blank fails politely is test_exercises.py's.
Budget: one grid size (q = 2) per mistake."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex06

GRAD_X = "    grad_x = mt.comm.reduce_scatter(grad @ w_col, grid.row, dim=1)\n"
GRAD_W = "    grad_w = mt.comm.reduce_scatter(grad.T @ x_row, grid.col, dim=1)\n"
GRAD_B = "    grad_b = mt.comm.all_reduce(grad.sum(0), grid.col)\n"


@pytest.fixture
def q2(monkeypatch):
    monkeypatch.setattr(ex06, "WORLD_SIZES", (4,))


def _checks(tmp_path, old, new):
    report = mt.grade("ex06", path=_variant(tmp_path, "ex06", (old, new)))
    assert not report.passed
    return {c.name.split(": ", 1)[1].split(" ")[0]: c for c in report.checks}


@pytest.mark.parametrize("new,words", [
    ("    grad_x = mt.comm.reduce_scatter(grad @ w_col, grid.col, dim=1)\n",
     "grad_x is wrong: summed along the grid column"),
    ("    grad_x = mt.comm.all_reduce(grad @ w_col, grid.row)\n",
     "grad_x has shape (3, 12), expected (3, 6) (the whole row block kept)"),
    ("    grad_x = (grad @ w_col).chunk(grid.q, 1)[grid.row.rank]\n",
     "grad_x is wrong: not summed: this rank's own term"),
])
def test_grad_x_mistakes_are_named(tmp_path, q2, new, words):
    checks = _checks(tmp_path, GRAD_X, new)
    assert not checks["grad_x"].passed and words in checks["grad_x"].detail, checks["grad_x"]
    assert "grid row i must be summed" in checks["grad_x"].hint
    assert checks["grad_w"].passed and checks["grad_b"].passed


@pytest.mark.parametrize("new,words", [
    ("    grad_w = mt.comm.reduce_scatter(grad.T @ x_row, grid.row, dim=1)\n",
     "grad_w is wrong: summed along the grid row"),
    ("    grad_w = mt.comm.reduce_scatter(x_row.T @ grad, grid.col, dim=0)\n",
     "grad_w has shape (6, 9), expected (9, 6) (in X·dY's layout, not nn.Linear's)"),
])
def test_grad_w_mistakes_are_named(tmp_path, q2, new, words):
    checks = _checks(tmp_path, GRAD_W, new)
    assert not checks["grad_w"].passed and words in checks["grad_w"].detail, checks["grad_w"]
    assert checks["grad_x"].passed and checks["grad_b"].passed


@pytest.mark.parametrize("new,words", [
    ("    grad_b = grad.sum(0)\n", "grad_b is wrong: not summed: this rank's tokens only"),
    ("    grad_b = mt.comm.all_reduce(grad.sum(0), grid.row)\n",
     "grad_b is wrong: summed along the grid row"),
])
def test_grad_b_mistakes_are_named(tmp_path, q2, new, words):
    checks = _checks(tmp_path, GRAD_B, new)
    assert not checks["grad_b"].passed and words in checks["grad_b"].detail, checks["grad_b"]
    assert "each on its own tokens" in checks["grad_b"].hint


def test_a_missing_collective_is_named(tmp_path, q2):
    checks = _checks(tmp_path, GRAD_B, "    grad_b = grad.sum(0)\n")
    assert not checks["one"].passed
    assert "reduce_scatter along row, reduce_scatter along col" in checks["one"].detail
