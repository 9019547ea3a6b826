"""ex08 (c), in the parent: the five checks of the ring from what every rank found
(ex08_ring.py): the blocks passed, the running (out, lse) after each step, the final
attention, the work, the backward. A wrong step is named by the mistake that explains it.
"""

from __future__ import annotations

import math

from ...rules import cp_chunks
from .base import Check
from .ex08_merge import TOLERANCE
from .ex08_ring import HYPOTHESES, _kind


def _problem(name, per_rank) -> Check | None:
    for rank, found in enumerate(per_rank):
        for step, s in enumerate(found["steps"]):
            if "problem" in s:
                return Check(name, False, f"rank {rank}, step {step}: {s['problem']}", rank=rank,
                             hint="return (out, lse, k_next, v_next), each shaped like the "
                                  "one it replaces")
    return None


def _passing(name, per_rank, n) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    for rank, found in enumerate(per_rank):
        for step, s in enumerate(found["steps"]):
            where = f"rank {rank}, step {step}"
            if step == n - 1 and not s["sent"]:
                continue  # the last hop carries a block no rank needs: skipping it is right
            if not s["sent"]:
                return Check(name, False, f"{where}: sent nothing: K/V not passed on", rank=rank,
                             hint="every step but the last, send k and v to axis.next and "
                                  "receive the next block from axis.prev (mt.comm.sendrecv)")
            if any(peer != s["next"] for peer in s["sent"]):
                return Check(name, False, f"{where}: sent to rank(s) {sorted(set(s['sent']))}; "
                             f"axis.next is rank {s['next']}", rank=rank,
                             hint="the blocks travel one way: send to axis.next, receive from "
                                  "axis.prev")
            want = (rank - step - 1) % n
            if s["holds"] != [want]:
                held = (f"rank {s['holds'][0]}'s block" if s["holds"]
                        else "no rank's block")
                why = (": its own, the received one was dropped" if s["holds"] == [rank]
                       else "")
                return Check(name, False, f"{where}: returned {held}{why}; it should return "
                             f"rank {want}'s, received from axis.prev", rank=rank,
                             tensor="k_next, v_next",
                             hint="return what sendrecv wrote into the receive buffers")
    return Check(name, True, "every step before the last: K and V sent to axis.next, the block "
                 "of rank r-s-1 returned")


def _steps(name, per_rank, n) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    worst, failed = 0.0, []
    for rank, found in enumerate(per_rank):
        for step, s in enumerate(found["steps"]):
            if s["errors"]["right"] <= TOLERANCE:
                worst = max(worst, s["errors"]["right"])
            else:
                failed.append((rank, step, s["errors"]))
    if not failed:
        return Check(name, True, f"largest error {worst:.1e}", max_error=worst)
    # Name the mistake that explains every failed step (one step alone can fit two).
    rank, step, errors = failed[0]
    for mistake in HYPOTHESES[1:]:
        if all(e[mistake] <= TOLERANCE for _, _, e in failed):
            detail, hint = _diagnosis(mistake, rank, step, n)
            return Check(name, False, f"rank {rank}, after step {step}: {detail}", rank=rank,
                         tensor="out, lse", hint=hint)
    return Check(name, False, f"rank {rank}, after step {step}: largest error "
                 f"{errors['right']:.3g}", rank=rank, tensor="out, lse",
                 max_error=errors["right"],
                 hint="for each of your query chunks and each key chunk that arrived: "
                      "block_attention on what the causal mask keeps, merged into that query "
                      "chunk's rows of (out, lse)")


MASK = ("each (query chunk, key chunk) pair: a key chunk before the query chunk, whole; the "
        "same chunk, the causal triangle; a key chunk after it, nothing")


def _diagnosis(mistake, rank, step, n) -> tuple[str, str]:
    """What the learner's step did, in words, and what to do instead."""
    owner = (rank - step) % n
    mine, theirs = cp_chunks(rank, n), cp_chunks(owner, n)
    pairs = [(mine[a], theirs[b]) for a in range(2) for b in range(2)]
    if mistake == "wrong owner":
        return (f"treated the K/V it held as rank {(rank + step) % n}'s; they were rank "
                f"{owner}'s", "the blocks move one rank per step toward axis.next: count "
                "which rank's K/V have reached this one after `step` moves")
    if mistake == "reversed":
        return (f"the attention over the blocks of ranks {rank}, {(rank + 1) % n}, ..: the "
                "ring turned the wrong way", "K/V go to axis.next and come from axis.prev")
    if mistake == "wrong way":
        return (f"computed with rank {(rank + step) % n}'s K/V as if they were rank {owner}'s: "
                "they came round the ring from axis.next", "send to axis.next, receive from "
                "axis.prev")
    if mistake == "contiguous":
        return (f"numbered its chunks {2 * rank} and {2 * rank + 1}, and the K/V's "
                f"{2 * owner} and {2 * owner + 1}, as a contiguous split would; it holds chunks "
                f"{mine[0]} and {mine[1]}, and the K/V it held were rank {owner}'s chunks "
                f"{theirs[0]} and {theirs[1]}", "every rank holds chunks_of(its rank): "
                "yours, and the K/V's owner's")
    if mistake == "same halves":
        return ("each query chunk met only the key chunk in the same place (first with "
                "first, second with second)", "both query chunks meet both key chunks, "
                f"four pairs per step; {MASK}")
    if mistake == "keys swapped":
        return (f"took the K/V's first chunk for chunk {theirs[1]} and its second for chunk "
                f"{theirs[0]}", "K/V arrive as their owner's split cut them: the early chunk "
                "first")
    if mistake == "later":
        q_chunk, k_chunk = next(p for p in pairs if _kind(*p) is None)
        return (f"attended to key chunk {k_chunk}, which lies after query chunk {q_chunk}: "
                "every key in it is later than every query", f"skip it: {MASK}")
    q_chunk = next(q for q, k in pairs if q == k)  # "no triangle"
    return (f"attended to all of key chunk {q_chunk} for query chunk {q_chunk}, itself: the "
            "keys after each query were seen", "the block on the diagonal is the causal "
            "triangle: block_attention(..., causal=True)")


def _final(name, per_rank) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    rank, error = max(enumerate(f["final"] for f in per_rank), key=lambda p: p[1])
    if error > TOLERANCE:
        return Check(name, False, f"rank {rank}: largest error {error:.3g}", rank=rank,
                     tensor="out, lse", max_error=error,
                     hint="after cp steps every block has visited every rank once")
    return Check(name, True, f"largest error {error:.1e}", max_error=error)


def _work(name, per_rank, n) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    counts, want = [f["blocks"] for f in per_rank], 2 * n + 1
    if 0 in counts:
        rank = counts.index(0)
        return Check(name, False, f"rank {rank} computed no block through block_attention",
                     rank=rank, hint="compute each (query chunk, key chunk) block with "
                     "block_attention: the grader counts its calls, in chunk x chunk blocks")
    if len(set(counts)) > 1:
        shown = ", ".join(f"rank {r}: {c:g}" for r, c in enumerate(counts))
        return Check(name, False, f"blocks computed: {shown}: unequal, and every step of the "
                     "ring waits for the busiest rank", rank=counts.index(max(counts)),
                     hint="one early chunk and one late chunk per rank need the same work "
                          f"together, {want} blocks at cp={n}: " + MASK)
    right = all(f["final"] is not None and f["final"] <= TOLERANCE for f in per_rank)
    if counts[0] > want and right:  # e.g. one masked 2L x 2L call a step: balanced, right
        extra = counts[0] - want
        return Check(name, True, f"every rank computed {counts[0]:g} blocks, the same work, "
                     f"where the causal mask keeps {want}: the other {extra:g} were masked "
                     f"away whole; skipping them (as flash attention does) would save "
                     f"{extra / counts[0]:.0%} of the step's work")
    if counts[0] > want:
        return Check(name, False, f"every rank computed {counts[0]:g} blocks where the causal "
                     f"mask keeps {want}: blocks whose keys all come after their queries were "
                     "computed", hint="a key chunk after the query chunk needs no block")
    if counts[0] < want:
        return Check(name, False, f"every rank computed {counts[0]:g} blocks where the causal "
                     f"mask keeps {want}: some were skipped", hint=MASK)
    return Check(name, True, f"every rank computed {want} blocks (a triangle counted as one)")


def _backward(name, per_rank, n) -> Check:
    """The exercise's functions are forward-only: the gradients are autograd's, through the
    learner's `ring_step` (its masking, its `merge`, its bookkeeping of out and lse). Each
    block a rank held is a leaf of its own, so its gradient is this rank's share of the
    owner's dK, dV; the shares are summed at their owner (the journey home that minitp's
    ring makes in backward), and compared with causal attention's, float64."""
    bad = _problem(name, per_rank)
    if bad:
        return bad
    if any(f["final"] is None or f["final"] > TOLERANCE for f in per_rank) or any(
            kv[0] is None for f in per_rank for kv in f["grads"]["dkv"]):
        return Check(name, False, "not checked: the forward above is wrong")
    for rank, f in enumerate(per_rank):
        g = f["grads"]
        if g["crash"] and WRITTEN in g["crash"]:
            return Check(name, False, f"rank {rank}: backward failed: a tensor the merge saved "
                         "was written in place since (the running out or lse)", rank=rank,
                         tensor="out, lse", hint="the forward is right, but autograd saved the "
                         "running (out, lse) to differentiate the merge; build the new result "
                         "(torch.cat of the merged chunks), never write into out or lse")
        if g["crash"]:
            return Check(name, False, f"rank {rank}: backward raised RuntimeError: "
                         f"{g['crash']}", rank=rank, hint="every operation from q, k, v to out "
                         "must be one autograd can differentiate")
        if g["cut"] or not (g["dq"].any() or any(t.any() for _, *kv in g["dkv"] for t in kv)):
            return Check(name, False, f"rank {rank}: no gradient reached q, k or v: the "
                         "step cut the graph", rank=rank, tensor="out",
                         hint="the values are right, but something detached them "
                              "(.detach(), .data, torch.no_grad(), a copy through numpy): "
                              "training would learn nothing from the attention")
    worst = 0.0
    for rank, f in enumerate(per_rank):  # q never travels: its gradient is the rank's own
        error = (f["grads"]["dq"] - f["grads"]["want"][0]).abs().nan_to_num(math.inf).max()
        if error > TOLERANCE:
            return Check(name, False, f"rank {rank}: the gradient of q is off by {error:.3g}",
                         rank=rank, tensor="q.grad", max_error=error.item(), hint=GRAD_HINT)
        worst = max(worst, error.item())
    for owner in range(n):  # each block's gradient home: every rank's share, summed
        home = [sum(kv[1 + i] for f in per_rank for kv in f["grads"]["dkv"] if kv[0] == owner)
                for i in range(2)]
        for i, tensor in enumerate(("k", "v")):
            error = (home[i] - per_rank[owner]["grads"]["want"][1 + i]).abs()
            error = error.nan_to_num(math.inf).max()
            if error > TOLERANCE:
                return Check(name, False, f"rank {owner}: the gradient of its {tensor}, summed "
                             f"over the ranks that attended to it, is off by {error:.3g}",
                             rank=owner, tensor=f"{tensor}.grad", max_error=error.item(),
                             hint=GRAD_HINT)
            worst = max(worst, error.item())
    return Check(name, True, f"dq on every rank, dK and dV summed at their owner: largest "
                 f"error {worst:.1e}", max_error=worst)


WRITTEN = "modified by an inplace operation"  # autograd's version check
GRAD_HINT = ("the forward is right, so the backward differs where autograd sees operations "
             "the values do not show: a nan or inf in a masked-out branch (torch.where), or a "
             "result built from copies instead of the merge's own tensors")
