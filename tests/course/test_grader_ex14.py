"""The grader of ex14 (who writes and who reads a ZeRO-1, tp = 2 checkpoint loaded at tp = 1,
lesson 14) names the usual mistakes: each wrong version here is the reference solution with
one mistake built in, graded, and its diagnosis asserted. That the solution passes and the
untouched exercise fails every check is asserted elsewhere (the lesson's cell;
tests/course/test_exercises.py). No process is launched.

The checks, in order: 0 tp_block, 1 state_owner, 2 writes, 3 reads exact, 4 reads only
what it needs."""

import ast
import re

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course import grading


def _grade(tmp_path, *edits):
    report = mt.grade("ex14", path=_variant(tmp_path, "ex14", *edits))
    return report, [c.passed for c in report.checks]


def test_a_split_on_the_wrong_dimension_is_named(tmp_path):
    report, passed = _grade(tmp_path, ('dim = 1 if rule == "row" else 0', "dim = 0"))
    block = report.checks[0]
    assert not block.passed, str(report)
    assert "row" in block.detail and "split along dim 0" in block.hint, block.hint
    assert "(out_features, in_features)" in block.hint


OWNER_SLIPS = {  # the slip built in -> words the state_owner check's detail must contain
    "the position in the parameter alone, not in the tp rank's flat vector": (
        ("global_rank(t, int(at[0]) // size, tp)", "global_rank(t, element // size, tp)"),
        "the state placed in the wrong dp rank's shard", "// s"),
    "every tp rank's holder taken for the state's writer": (
        ("return min(holders)", "return max(holders)"),
        "holds it too, but the lowest holder writes it", "lowest global rank"),
}


@pytest.mark.parametrize("slip", sorted(OWNER_SLIPS))
def test_each_slip_in_the_state_owner_is_named(tmp_path, slip):
    edit, words, hint = OWNER_SLIPS[slip]
    report, passed = _grade(tmp_path, edit)
    assert passed[0] and not passed[1], str(report)
    assert words in report.checks[1].detail and hint in report.checks[1].hint, str(report)


WRITE_SLIPS = {  # the slip built in -> words the detail and the hint must contain
    "a dp replica writes the model again": (
        ("if dp_rank == 0:", "if True:"),
        ("a replica writing bytes another replica already wrote", "dp 1"), "the lowest of them"),
    "a tp rank writes a replicated parameter again": (
        ("if p.rule is not None or tp_rank == 0:", "if True:"),
        ("writes the replicated", "rank 1"), "rank 0, the lowest"),
    "every dp rank writes its tp rank's whole optimizer state": (
        ("shard = slice(dp_rank * size, (dp_rank + 1) * size)", "shard = slice(0, len(ids))"),
        ("writes all of tp rank 0's optimizer state", "only its 1/2"), "[d·s, (d+1)·s)"),
}


@pytest.mark.parametrize("slip", sorted(WRITE_SLIPS))
def test_each_slip_in_the_writes_is_named(tmp_path, slip):
    edit, words, hint = WRITE_SLIPS[slip]
    report, passed = _grade(tmp_path, edit)
    assert passed == [True, True, False, True, True], str(report)
    writes = report.checks[2]
    assert all(w in writes.detail for w in words), writes.detail
    assert hint in writes.hint, writes.hint


def test_the_optimizer_shard_read_from_the_wrong_dp_rank_is_named(tmp_path):
    # the old dp rank taken as if the new shards nested inside the old ones
    report, passed = _grade(tmp_path, (
        "writer = rank_file(state_owner(table, k, e, old_tp, old_dp))",
        "writer = rank_file(state_owner(table, k, e, old_tp, old_dp) % old_tp\n"
        "                           + old_tp * (dp_rank * old_dp // new_dp))"))
    assert passed[:3] == [True, True, True] and not passed[3], str(report)
    reads = report.checks[3]
    assert "read from the wrong dp rank" in reads.detail, reads.detail
    assert "do not nest" in reads.hint


def test_every_rank_reading_the_whole_checkpoint_is_named(tmp_path):
    source = _variant(tmp_path, "ex14").read_text()
    start = source.index("def reads(")
    end = source.find("\ndef ", start + 1)
    whole = ("def reads(table, dp_rank, old_tp, old_dp, new_dp):\n"
             "    out = {}\n"
             "    for r in range(old_tp * old_dp):\n"
             "        out.update(writes(table, r % old_tp, r // old_tp, old_tp, old_dp))\n"
             "    return out\n\n")
    path = tmp_path / "ex14_whole.py"
    path.write_text(source[:start] + whole + (source[end:] if end > 0 else ""))
    report = mt.grade("ex14", path=path)
    assert [c.passed for c in report.checks] == [True, True, True, True, False], str(report)
    bytes_check = report.checks[4]
    assert "every rank reads the whole file" in bytes_check.detail, bytes_check.detail
    assert bytes_check.tensor == "bytes" and bytes_check.max_error > 0


@pytest.mark.ranks  # write_example launches 4 ranks
def test_the_graders_reference_is_what_real_ranks_write(tmp_path):
    """The grader's layout, built in one process from the tensor-parallel plan and
    FlatShard, is what minitp's sharded save writes on 4 real ranks at (tp 2, dp 2, ZeRO-1):
    the same elements in the same rank's file."""
    from minitp.checkpoint import measure
    from minitp.course.graders import ex14

    label, cfg, tp, dp, _ = ex14.CASES[0]
    sizes = {k: getattr(cfg, k) for k in ("vocab_size", "seq_len", "n_layer", "n_head",
                                          "d_model")}
    manifest = measure.write_example(str(tmp_path), dp=dp, tp=tp, zero_stage=1, cfg=sizes)
    written = {name: {(held["tensor"], i) for held in entry["holds"]
                      for start, stop in held["runs"] for i in range(start, stop)}
               for name, entry in manifest["files"].items()}
    assert written == ex14._layout(0).files, label


def test_the_hints_ask_and_do_not_tell():
    # the hints sit in the learner's file: each points with questions, none states the
    # function's algorithm (every sentence a question)
    tree = ast.parse(grading.exercise_path("ex14").read_text())
    hints = [node.exc.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Raise)
             and getattr(node.exc, "args", None)]
    assert len(hints) == 4, hints
    for hint in hints:
        sentences = [s for s in re.split(r"(?<=[.?!])\s+", hint.strip()) if s]
        assert all(s.endswith("?") for s in sentences), hint
