"""The grader of ex08 (the online-softmax merge, the load-balanced split and one ring step,
lesson 08) names the usual mistakes: every wrong answer here is the reference solution
with one mistake built in, and each diagnosis the grader can give has a test. That the
solution passes every check and the untouched exercise fails every one is
tests/course/test_exercises.py's (parametrized over every exercise, ex08 included); here
the blank's message is checked word for word.

The checks, in order: 0-3 the merge, 4-5 the split (all in this process), then five per
cp size: 0 the K/V passed on, 1 every step's running result, 2 the final result, 3 the
work per rank, 4 the backward through the steps; last, three of the learner's own block
backward (in this process).

Budget: the merge's and the split's mistakes are graded in this process alone (no ring
launched); the ring's at one cp size each (cp = 4 where cp = 2 cannot tell the mistake
apart: on a ring of two, rank r+1 is rank r-1)."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex08

MERGE = ("    out = (torch.exp(lse1 - lse).unsqueeze(-1) * out1\n"
         "           + torch.exp(lse2 - lse).unsqueeze(-1) * out2)\n")
CHUNKS = "return rank, 2 * cp - 1 - rank"
SPLIT_RETURN = "    return torch.cat([chunks[c] for c in mine], dim=-2), positions\n"
OWNER = "owner = (axis.rank - step) % axis.size"
SEND_K = "k_next = mt.comm.sendrecv(k, axis.next, torch.empty_like(k), axis.prev)"
SEND_V = "v_next = mt.comm.sendrecv(v, axis.next, torch.empty_like(v), axis.prev)"
SEND_BACK = [(SEND_K, "k_next = mt.comm.sendrecv(k, axis.prev, torch.empty_like(k), axis.next)"),
             (SEND_V, "v_next = mt.comm.sendrecv(v, axis.prev, torch.empty_like(v), axis.next)")]


def _sizes(monkeypatch, *sizes):
    monkeypatch.setattr(ex08, "WORLD_SIZES", sizes)


def _ring(tmp_path, monkeypatch, size, *edits):
    """The ring's five checks at cp = `size`, for the solution with `edits` made."""
    _sizes(monkeypatch, size)
    checks = mt.grade("ex08", path=_variant(tmp_path, "ex08", *edits)).checks
    assert all(c.passed for c in checks[:6] + checks[-BACKWARD:]), checks[:6] + checks[-3:]
    return checks[6:-BACKWARD]


BACKWARD = 3  # the block backward's checks, after the ring's


def _backward(tmp_path, monkeypatch, *edits):
    """The block backward's three checks (no ring launched), for the solution with `edits`
    made; every other check in this process must pass."""
    _sizes(monkeypatch)
    checks = mt.grade("ex08", path=_variant(tmp_path, "ex08", *edits)).checks
    assert all(c.passed for c in checks[:-BACKWARD]), checks[:-BACKWARD]
    return checks[-BACKWARD:]


def test_the_blank_says_what_is_not_written_and_gives_its_hint(monkeypatch):
    _sizes(monkeypatch, 2)
    report = mt.grade("ex08")
    assert not any(c.passed for c in report.checks), str(report)
    merge, split, ring = report.checks[0], report.checks[4], report.checks[6]
    assert merge.detail == "merge is not written yet"
    assert merge.hint.startswith("the whole log-sum-exp first")
    assert split.detail == "chunks_of is not written yet"
    assert split.hint == "one chunk counted from the start of the sequence, one from its end"
    assert ring.detail == "ring_step is not written yet", str(report)
    assert ring.hint.startswith("whose K/V is this, after `step` moves round the ring?")
    backward = report.checks[-BACKWARD]
    assert backward.detail == "block_backward is not written yet"
    assert backward.hint.startswith("which share of each query's softmax is this block's")


# --------------------------------------------------------------------------- the merge
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
    assert [c.passed for c in checks] == [True, False] + [True] * 7, checks
    assert "scores near +1000" in checks[1].detail and "overflows" in checks[1].detail
    assert "subtract the larger lse" in checks[1].hint


def test_calling_the_librarys_merge_is_named(tmp_path, monkeypatch):
    _sizes(monkeypatch)
    borrowed = _variant(tmp_path, "ex08", (
        "    lse = torch.logaddexp(lse1, lse2)\n" + MERGE + "    return out, lse\n",
        "    return mt.context_parallel.merge_partials(out1, lse1, out2, lse2)\n"))
    checks = mt.grade("ex08", path=borrowed).checks
    assert [c.passed for c in checks] == [True] * 3 + [False] + [True] * 5, checks
    assert "merge_partials" in checks[3].detail


# --------------------------------------------------------------------------- the split
def test_a_contiguous_split_is_named_in_the_split_the_ring_and_the_work(tmp_path, monkeypatch):
    _sizes(monkeypatch, 2)
    contiguous = _variant(tmp_path, "ex08", (CHUNKS, "return 2 * rank, 2 * rank + 1"))
    checks = mt.grade("ex08", path=contiguous).checks
    assert [c.passed for c in checks] == ([True] * 4 + [False, False] + [True] + [False] * 4
                                          + [True] * BACKWARD)
    assert checks[4].detail.startswith("rank 0 of cp=2: chunks_of gives chunks 0 and 1: a "
                                       "contiguous split"), checks[4]
    assert checks[5].detail.endswith("a contiguous split's; expected [0, 1, 2, 9, 10, 11]")
    assert checks[7].detail == ("rank 0, after step 1: numbered its chunks 0 and 1, and the "
                                "K/V's 2 and 3, as a contiguous split would; it holds chunks 0 "
                                "and 3, and the K/V it held were rank 1's chunks 1 and 2")
    assert checks[9].detail.startswith("blocks computed: rank 0: 3, rank 1: 7: unequal")


def test_a_contiguous_part_is_named_where_the_chunk_numbers_are_right(tmp_path, monkeypatch):
    _sizes(monkeypatch)
    sliced = _variant(tmp_path, "ex08", (SPLIT_RETURN, "    return x[..., rank * 2 * length:"
                                         "(rank + 1) * 2 * length, :], positions\n"))
    checks = mt.grade("ex08", path=sliced).checks
    assert [c.passed for c in checks] == [True] * 4 + [False] + [True] * 4, checks
    assert checks[4].detail == "rank 0 of cp=2: the part is positions 0..5 of x: a contiguous split"


def test_the_late_chunk_first_is_named(tmp_path, monkeypatch):
    _sizes(monkeypatch)
    late = _variant(tmp_path, "ex08", (CHUNKS, "return 2 * cp - 1 - rank, rank"))
    checks = mt.grade("ex08", path=late).checks
    assert not checks[4].passed and not checks[5].passed, checks
    assert checks[4].detail == ("rank 0 of cp=2: chunks_of gives (3, 0): the late chunk first; "
                                "it holds chunks 0 and 3, early one first")


def test_positions_counted_from_zero_on_every_rank_are_named(tmp_path, monkeypatch):
    _sizes(monkeypatch)
    local = _variant(tmp_path, "ex08", (SPLIT_RETURN, "    return torch.cat([chunks[c] for c "
                                        "in mine], dim=-2), torch.arange(2 * length)\n"))
    checks = mt.grade("ex08", path=local).checks
    assert [c.passed for c in checks] == [True] * 5 + [False] + [True] * 3, checks
    assert "counted from 0 on every rank" in checks[5].detail


# --------------------------------------------------------------------------- the ring
def test_the_wrong_ranks_block_is_named_at_cp_4(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 4, (OWNER, "owner = (axis.rank + step) % axis.size"))
    assert [c.passed for c in checks] == [True, False, False, True, False], checks
    assert checks[1].detail == ("rank 1, after step 1: treated the K/V it held as rank 2's; "
                                "they were rank 0's"), checks[1]


def test_k_v_received_from_the_wrong_side_is_named_at_cp_4(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 4, *SEND_BACK)
    assert [c.passed for c in checks] == [False, False, False, True, False], checks
    assert checks[0].detail == "rank 0, step 0: sent to rank(s) [3]; axis.next is rank 1"
    assert checks[1].detail == ("rank 0, after step 1: computed with rank 1's K/V as if they "
                                "were rank 3's: they came round the ring from axis.next")


def test_a_ring_turned_the_wrong_way_is_named_at_cp_4(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 4, *SEND_BACK,
                   (OWNER, "owner = (axis.rank + step) % axis.size"))
    assert [c.passed for c in checks] == [False, False, True, True, True], checks
    assert checks[1].detail.endswith("the ring turned the wrong way"), checks[1]


def test_not_passing_k_v_on_is_named_both_ways(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 2, (
        f"    {SEND_K}\n    {SEND_V}\n", "    k_next, v_next = k, v\n"))
    assert [c.passed for c in checks] == [False, False, False, True, False], checks
    assert checks[0].detail == "rank 0, step 0: sent nothing: K/V not passed on"
    checks = _ring(tmp_path, monkeypatch, 2, ("    return out, lse, k_next, v_next\n",
                                              "    return out, lse, k, v\n"))
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


def test_pairing_each_query_chunk_with_one_key_chunk_is_named(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 2, ("        for b in range(2):\n",
                                              "        for b in (a,):\n"))
    assert [c.passed for c in checks] == [True, False, False, False, False], checks
    assert checks[1].detail == ("rank 0, after step 0: each query chunk met only the key chunk "
                                "in the same place (first with first, second with second)")
    assert checks[3].detail == ("every rank computed 3 blocks where the causal mask keeps 5: "
                                "some were skipped")


def test_the_blocks_key_chunks_swapped_is_named(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 2, ("chunks_of(owner, axis.size)\n",
                                              "chunks_of(owner, axis.size)[::-1]\n"))
    assert [c.passed for c in checks] == [True, False, False, True, False], checks
    assert checks[1].detail == ("rank 0, after step 0: took the K/V's first chunk for chunk 3 "
                                "and its second for chunk 0")


def test_attending_a_later_chunk_is_named_with_the_work_it_added(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 2, (
        "            if theirs[b] > mine[a]:\n"
        "                continue  # every key after every query\n", ""))
    assert [c.passed for c in checks] == [True, False, False, False, False], checks
    assert checks[1].detail == ("rank 0, after step 0: attended to key chunk 3, which lies "
                                "after query chunk 0: every key in it is later than every query")
    assert checks[3].detail.startswith("every rank computed 8 blocks where the causal mask "
                                       "keeps 5: blocks whose keys all come after")


def test_the_diagonal_chunk_without_its_triangle_is_named(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 2, ("causal=theirs[b] == mine[a]", "causal=False"))
    assert [c.passed for c in checks] == [True, False, False, True, False], checks
    assert checks[1].detail == ("rank 0, after step 0: attended to all of key chunk 0 for query "
                                "chunk 0, itself: the keys after each query were seen")
    assert "causal=True" in checks[1].hint


def test_blocks_computed_without_block_attention_are_named(tmp_path, monkeypatch):
    checks = _ring(tmp_path, monkeypatch, 2,
                   ("\n\ndef ring_step(", "\n\n_attend = block_attention\n\n\ndef ring_step("),
                   ("partial = block_attention(", "partial = _attend("))
    assert [c.passed for c in checks] == [True, True, True, False, True], checks
    assert checks[3].detail == "rank 0 computed no block through block_attention"


LOOP = ("    for a in range(2):\n        for b in range(2):\n"
        "            if theirs[b] > mine[a]:\n")
ONE_CALL = (  # the step's four blocks in one masked 2L x 2L call, by position
    "    size = q.shape[-2] // 2\n"
    "    at = lambda cs: torch.cat([torch.arange(c * size, (c + 1) * size) for c in cs])\n"
    "    keep = (at(theirs)[None, :] <= at(mine)[:, None]).to(q.device)\n"
    "    out, lse = merge(out, lse, *block_attention(q, k, v, False, keep=keep))\n"
    "    for a in ():\n        for b in range(2):\n"
    "            if theirs[b] > mine[a]:\n")


def test_one_masked_call_a_step_passes_its_waste_said(tmp_path, monkeypatch):
    # results are judged, not calls: one masked 2L x 2L call a step is right and balanced
    # (4 blocks a step on every rank), the lesson's point; the grader prices the waste
    ring = _ring(tmp_path, monkeypatch, 2, (LOOP, ONE_CALL),
                 ("    out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)\n", ""))
    assert [c.passed for c in ring] == [True, True, True, True, True], ring
    assert ring[3].detail == ("every rank computed 8 blocks, the same work, where the causal "
                              "mask keeps 5: the other 3 were masked away whole; skipping "
                              "them (as flash attention does) would save 38% of the step's "
                              "work"), ring[3].detail


# --------------------------------------------------------------------------- the backward
MERGE_INTO = "            outs[a], lses[a] = merge(outs[a], lses[a], *partial)\n"


def test_a_running_result_written_in_place_is_named_by_the_backward(tmp_path, monkeypatch):
    # The running (out, lse) sliced (not chunked: chunk's views refuse in-place writes in
    # the forward already) and each merge written into it in place: every forward check
    # passes (the old grader's four), but autograd saved the old values for the merge's
    # backward.
    half = "q.shape[-2] // 2"
    ring = _ring(tmp_path, monkeypatch, 2, (
        "outs, lses = list(out.chunk(2, dim=-2)), list(lse.chunk(2, dim=-1))",
        f"outs = [out[..., :{half}, :], out[..., {half}:, :]]\n"
        f"    lses = [lse[..., :{half}], lse[..., {half}:]]"), (
        MERGE_INTO,
        f"            rows = slice(a * {half}, (a + 1) * {half})\n"
        "            out[..., rows, :], lse[..., rows] = merge(outs[a], lses[a], *partial)\n"))
    assert [c.passed for c in ring] == [True, True, True, True, False], ring
    assert ring[4].detail == ("rank 0: backward failed: a tensor the merge saved was written "
                              "in place since (the running out or lse)"), ring[4].detail
    assert "never write into out or lse" in ring[4].hint


def test_a_step_that_cuts_the_graph_is_named_by_the_backward(tmp_path, monkeypatch):
    ring = _ring(tmp_path, monkeypatch, 2, (
        MERGE_INTO, "            partial = [t.detach() for t in partial]\n" + MERGE_INTO))
    assert [c.passed for c in ring] == [True, True, True, True, False], ring
    assert ring[4].detail == "rank 0: no gradient reached q, k or v: the step cut the graph"
    assert "torch.no_grad()" in ring[4].hint


def test_the_backward_is_not_judged_when_the_forward_is_wrong(tmp_path, monkeypatch):
    ring = _ring(tmp_path, monkeypatch, 2, ("causal=theirs[b] == mine[a]", "causal=False"))
    assert not ring[2].passed
    assert ring[4].detail == "not checked: the forward above is wrong"


# --------------------------------------------------------------------------- the block backward
SHARE = "    p = torch.exp(scores - lse.unsqueeze(-1))  # this block's share of the final softmax\n"
DELTA = "    delta = (dout * out).sum(-1, keepdim=True)  # Σ_j p_j dp_j, every key: dout · out\n"
DS = "    ds = p * (dout @ v.transpose(-2, -1) - delta)\n"


def test_another_correct_block_backward_passes(tmp_path, monkeypatch):
    # every correct way is accepted: here the block's own softmax, rescaled by the block's
    # share of each query's mass (its own lse against the final one)
    checks = _backward(tmp_path, monkeypatch, (
        SHARE, "    p = (torch.softmax(scores, dim=-1)\n"
        "         * torch.exp(torch.logsumexp(scores, dim=-1) - lse).unsqueeze(-1))\n"))
    assert all(c.passed for c in checks), checks


@pytest.mark.parametrize("edit, detail", [
    ((SHARE, "    p = torch.softmax(scores, dim=-1)\n"),
     "each block's probabilities were normalised over its own keys, as if they were all the keys"),
    ((SHARE + DELTA, "    p = torch.softmax(scores, dim=-1)\n"
      "    delta = (p * (dout @ v.transpose(-2, -1))).sum(-1, keepdim=True)\n"),
     "each block was differentiated as an attention of its own (its own softmax, its own row "
     "sums)"),
    ((DS, "    ds = p * (dout @ v.transpose(-2, -1))\n"),
     "ds = p * dp: the softmax's backward lost its second term"),
    ((DELTA, "    delta = (p * (dout @ v.transpose(-2, -1))).sum(-1, keepdim=True)\n"),
     "D was summed over this block's keys only"),
    (("scale = 1 / math.sqrt(q.shape[-1])\n    scores = q @ k.transpose(-2, -1) * scale",
      "scale = 1.0\n    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])"),
     "dq and dk are sqrt(d) too large"),
], ids=["own softmax", "own attention", "no D", "block D", "no scale"])
def test_a_wrong_block_backward_is_named(tmp_path, monkeypatch, edit, detail):
    checks = _backward(tmp_path, monkeypatch, edit)
    assert not checks[0].passed and not checks[1].passed, checks
    assert checks[0].detail == detail and checks[1].detail == detail, checks


def test_the_diagonal_block_unmasked_is_named(tmp_path, monkeypatch):
    checks = _backward(tmp_path, monkeypatch, (
        "        scores = scores.masked_fill(above, float(\"-inf\"))\n", ""))
    assert [c.passed for c in checks] == [True, False, True], checks
    assert checks[1].detail.startswith("the diagonal block's probabilities above the diagonal")


def test_exponentiating_the_scores_alone_overflows_and_is_named(tmp_path, monkeypatch):
    checks = _backward(tmp_path, monkeypatch, (
        SHARE, "    p = torch.exp(scores) / torch.exp(lse).unsqueeze(-1)\n"))
    assert [c.passed for c in checks] == [True, True, False], checks
    assert checks[2].detail.startswith("scores near +1000: the gradients hold inf or nan")
