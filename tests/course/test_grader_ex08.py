"""The grader of ex08 (the online-softmax merge and one ring step, lesson 08) catches
the shortcuts, each by name: every wrong answer here is the reference solution with
one shortcut built in. That the solution passes every check and the untouched
exercise fails every one is tests/course/test_exercises.py's (parametrized over every
exercise, ex08 included); here the blank's message is checked word for word.

Budget: the merge's shortcuts are graded in this process alone (no ring launched);
the ring's at one cp size each (cp = 4 where cp = 2 cannot tell the mistake apart:
on a ring of two, rank r+1 is rank r-1)."""

from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex08

MERGE = ("    out = (torch.exp(lse1 - lse).unsqueeze(-1) * out1\n"
         "           + torch.exp(lse2 - lse).unsqueeze(-1) * out2)\n")


def _sizes(monkeypatch, *sizes):
    monkeypatch.setattr(ex08, "WORLD_SIZES", sizes)


def test_the_blank_says_what_is_not_written_and_gives_its_hint(monkeypatch):
    _sizes(monkeypatch, 2)
    report = mt.grade("ex08")
    assert not any(c.passed for c in report.checks), str(report)
    merge, ring = report.checks[0], report.checks[4]
    assert merge.detail == "merge is not written yet" and merge.hint.startswith("ℓ = log(e^ℓ₁")
    assert ring.detail == "ring_step is not written yet", str(report)
    assert ring.hint.startswith("the block came from rank (axis.rank - step) % axis.size")


def test_averaging_the_two_outputs_is_named(tmp_path, monkeypatch):
    _sizes(monkeypatch)
    averaged = _variant(tmp_path, "ex08", (MERGE, "    out = (out1 + out2) / 2\n"))
    checks = mt.grade("ex08", path=averaged).checks
    assert not checks[0].passed and "plain average" in checks[0].detail, checks[0]
    assert "exp(lse_b - lse)" in checks[0].hint


def test_exponentiating_without_subtracting_the_max_overflows_and_is_named(tmp_path, monkeypatch):
    _sizes(monkeypatch)
    naive = _variant(tmp_path, "ex08", ("lse = torch.logaddexp(lse1, lse2)",
                                        "lse = torch.log(torch.exp(lse1) + torch.exp(lse2))"))
    checks = mt.grade("ex08", path=naive).checks
    assert [c.passed for c in checks] == [True, False, True, True], checks
    assert "scores near +1000" in checks[1].detail and "overflows" in checks[1].detail
    assert "subtract the larger lse" in checks[1].hint


def test_calling_the_librarys_merge_is_named(tmp_path, monkeypatch):
    _sizes(monkeypatch)
    borrowed = _variant(tmp_path, "ex08", (
        "    lse = torch.logaddexp(lse1, lse2)\n" + MERGE + "    return out, lse\n",
        "    return mt.context_parallel.merge_partials(out1, lse1, out2, lse2)\n"))
    checks = mt.grade("ex08", path=borrowed).checks
    assert [c.passed for c in checks] == [True, True, True, False], checks
    assert "merge_partials" in checks[3].detail


def test_the_wrong_ranks_block_is_named_at_cp_4(tmp_path, monkeypatch):
    _sizes(monkeypatch, 4)
    wrong = _variant(tmp_path, "ex08", ("src = (axis.rank - step) % axis.size",
                                        "src = (axis.rank + step) % axis.size"))
    checks = mt.grade("ex08", path=wrong).checks[4:]
    assert [c.passed for c in checks] == [True, False, False], checks
    assert checks[1].detail.startswith("rank 1, after step 1: treated the block it held as "
                                       "rank 2's; it was rank 0's"), checks[1]


def test_not_passing_k_v_on_is_named_both_ways(tmp_path, monkeypatch):
    _sizes(monkeypatch, 2)
    kept = _variant(tmp_path, "ex08", (
        "    k_next = mt.comm.sendrecv(k, axis.next, torch.empty_like(k), axis.prev)\n"
        "    v_next = mt.comm.sendrecv(v, axis.next, torch.empty_like(v), axis.prev)\n",
        "    k_next, v_next = k, v\n"))
    checks = mt.grade("ex08", path=kept).checks[4:]
    assert not any(c.passed for c in checks), checks
    assert checks[0].detail == "rank 0, step 0: sent nothing: K/V not passed on"
    dropped = _variant(tmp_path, "ex08", ("    return out, lse, k_next, v_next\n",
                                          "    return out, lse, k, v\n"))
    checks = mt.grade("ex08", path=dropped).checks[4:]
    assert not checks[0].passed and not checks[2].passed, checks
    assert checks[0].detail == ("rank 0, step 0: returned rank 0's block: its own, the received "
                                "one was dropped; it should return rank 1's, received from "
                                "axis.prev")


def test_a_ring_that_makes_the_last_useless_hop_passes_too(tmp_path, monkeypatch):
    """The reference skips the last hop (n - 1 suffice); a ring that makes all n is as right."""
    _sizes(monkeypatch, 2)
    every_hop = _variant(tmp_path, "ex08", (
        "    if step == axis.size - 1:  # every rank has seen every block: no hop left to make\n"
        "        return out, lse, k, v\n", ""))
    report = mt.grade("ex08", path=every_hop)
    assert report.passed, str(report)
