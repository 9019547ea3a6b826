"""The grader of ex22 (Muon's owner strategy, lesson 22) names the three mistakes the issue
names: an unbalanced owner map, a partial gradient orthogonalised, a shard orthogonalised.
Each wrong answer is the reference solution with one mistake built in; that the solution
passes is its lesson's cell, that the untouched exercise fails every check,
tests/course/test_exercises.py.

The checks, in order: (a) lpt_owners, (b) owner_update judged alone (the grader's map), (c)
the two together. Budget: one launch of 4 ranks per test, and two judged in process."""

from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex22


def _grade(tmp_path, *edits):
    return mt.grade("ex22", path=_variant(tmp_path, "ex22", *edits)).checks


def test_an_unbalanced_owner_map_is_named_with_its_busiest_rank():
    # judged in process: (a) is a map, no rank needed
    round_robin = [[j % ranks for j in range(len(costs))] for costs, ranks in ex22.COSTS]
    passed, detail, _ = ex22._judge_a({"a": round_robin})
    assert not passed
    assert "an unbalanced owner map round robin (j mod ranks)" in detail, detail
    assert "longest processing time first gives" in detail, detail


def test_a_partial_gradient_orthogonalised_is_named(tmp_path):
    # the home orthogonalises its own local gradient, not the rows the ranks sent it
    a, b, c = _grade(tmp_path, ("    done = {j: newton_schulz(torch.cat([run[k].view_as(mine[j]) "
                                "for run in runs]))",
                                "    done = {j: newton_schulz(local[j] + 0 * torch.cat("
                                "[run[k].view_as(mine[j]) for run in runs]))"))
    assert [a.passed, b.passed, c.passed] == [True, False, False]
    assert "a partial gradient orthogonalised" in b.detail, b.detail


def test_a_shard_orthogonalised_is_named(tmp_path):
    # each rank orthogonalises its own rows alone, no exchange
    a, b, c = _grade(tmp_path, ("    n, me, empty = axis.size, axis.rank, mine[0].new_zeros(0)\n",
                                "    return [newton_schulz(m) for m in mine]\n"))
    assert [a.passed, b.passed, c.passed] == [True, False, False]
    assert "a shard orthogonalised" in b.detail, b.detail


def test_gathers_pattern_is_named_where_owners_was_asked():
    # judged in process: the right rows, but by gather's collectives and work
    owners = ex22.lpt_owners([ex22.ns_flops(r, c) for r, c in ex22.SHAPES], ex22.DP)
    right = {key: [0.0 if key == "right" else 1.0] * len(ex22.SHAPES)
             for key in ("right", "partial", "patchwork", "shard")}
    record = {"errors": right, "ops": ["all_gather"] * len(ex22.SHAPES),
              "calls": list(ex22.SHAPES), "rank": 0}
    passed, detail, _ = ex22._judge_update(record, owners, "")
    assert not passed and "gather's pattern" in detail, detail
