"""The grader of ex14 (who writes and who reads a ZeRO-1, tp = 2 checkpoint loaded at tp = 1,
lesson 14) names the usual mistakes: each wrong version here is the reference solution with
one mistake built in, graded, and its diagnosis asserted. That the solution passes and the
untouched exercise fails every check is asserted elsewhere (the lesson's cell;
tests/course/test_exercises.py). No process is launched.

The checks, in order: 0 tp_block, 1 writes, 2 reads exact, 3 reads only what it needs."""

import pytest
from test_exercises import _variant

import minitp as mt


def _grade(tmp_path, *edits):
    report = mt.grade("ex14", path=_variant(tmp_path, "ex14", *edits))
    return report, [c.passed for c in report.checks]


def test_a_split_on_the_wrong_dimension_is_named(tmp_path):
    report, passed = _grade(tmp_path, ('dim = 1 if rule == "row" else 0', "dim = 0"))
    block = report.checks[0]
    assert not block.passed, str(report)
    assert "row" in block.detail and "split along dim 0" in block.hint, block.hint
    assert "(out_features, in_features)" in block.hint


WRITE_SLIPS = {  # the slip built in -> words the detail and the hint must contain
    "a dp replica writes the model again": (
        ("if dp_rank == 0:", "if True:"),
        ("a replica writing bytes another replica already wrote", "dp 1"),
        "one of them (dp 0)"),
    "a tp rank writes a replicated parameter again": (
        ("for p in table if p.rule is not None or tp_rank == 0}", "for p in table}"),
        ("writes the replicated", "tp 1"), "tp rank 0 writes it"),
    "every dp rank writes its tp rank's whole optimizer state": (
        ("shard = slice(dp_rank * size, (dp_rank + 1) * size)", "shard = slice(0, len(ids))"),
        ("writes all of tp rank 0's optimizer state", "only its 1/2"), "[d·s, (d+1)·s)"),
}


@pytest.mark.parametrize("slip", sorted(WRITE_SLIPS))
def test_each_slip_in_the_writes_is_named(tmp_path, slip):
    edit, words, hint = WRITE_SLIPS[slip]
    report, passed = _grade(tmp_path, edit)
    assert passed == [True, False, True, True], str(report)
    writes = report.checks[1]
    assert all(w in writes.detail for w in words), writes.detail
    assert hint in writes.hint, writes.hint


def test_the_optimizer_shard_read_from_the_wrong_dp_rank_is_named(tmp_path):
    # new ranks 0, 1 read old dp 0 and new ranks 2, 3 old dp 1, as if the shards nested
    report, passed = _grade(tmp_path, ("mine = at[(at // old_size) == d]",
                                       "mine = at if d == dp_rank * old_dp // new_dp else at[:0]"))
    assert passed[:2] == [True, True] and not passed[2], str(report)
    reads = report.checks[2]
    assert "read from the wrong dp rank" in reads.detail, reads.detail
    assert "do not nest" in reads.hint


def test_every_rank_reading_the_whole_checkpoint_is_named(tmp_path):
    source = _variant(tmp_path, "ex14").read_text()
    start = source.index("def reads(")
    end = source.find("\ndef ", start + 1)
    whole = ("def reads(table, dp_rank, old_tp, old_dp, new_dp):\n"
             "    out = {}\n"
             "    for t in range(old_tp):\n"
             "        for d in range(old_dp):\n"
             "            out.update(writes(table, t, d, old_tp, old_dp))\n"
             "    return out\n\n")
    path = tmp_path / "ex14_whole.py"
    path.write_text(source[:start] + whole + (source[end:] if end > 0 else ""))
    report = mt.grade("ex14", path=path)
    assert [c.passed for c in report.checks] == [True, True, True, False], str(report)
    bytes_check = report.checks[3]
    assert "every rank reads the whole file" in bytes_check.detail, bytes_check.detail
    assert bytes_check.tensor == "bytes" and bytes_check.max_error > 0
