"""Exercise 08: the online-softmax merge, then one step of ring attention.

Attention over a long sequence need not see every key at once. Split the keys
into blocks; for one block, a query's *partial* result is its softmax-weighted
average over that block's keys alone, O_b, together with the block's
log-sum-exp of the scores, ℓ_b = log Σ_j exp(s_j). Two partials over disjoint
keys hold everything the whole softmax needs:

    ℓ = log(e^ℓ₁ + e^ℓ₂),    O = e^(ℓ₁−ℓ)·O₁ + e^(ℓ₂−ℓ)·O₂

Each weight e^(ℓ_b−ℓ) is the share of the softmax's mass that block b holds.
Computed as written, e^ℓ overflows as soon as a score passes ~709 (float64) or
~88 (float32): subtract the larger ℓ before exponentiating (or use
``torch.logaddexp``, which does). A partial over no keys at all has ℓ = −inf
and O = 0: merging it must change nothing.

Part (a): `merge`, the two lines above, stably, on tensors: out (B, heads, n, d),
lse (B, heads, n).

Part (b): `ring_step`, one step of ring attention on one rank of the cp ring
(`axis`, n ranks). Here the sequence is split contiguously: rank r holds the
queries, keys and values of positions [r·c, (r+1)·c). At every step each rank
computes with the K/V block it holds, then passes that block on to
``axis.next`` and receives the next one from ``axis.prev``. So at step s rank r
holds the block of rank (r − s) mod n. After the last step every rank has seen
every block: that hop is yours to make or skip (n − 1 hops suffice). Under the
causal mask:

* a block from an earlier rank: every key is earlier, attend to all of it;
* its own block (step 0): the causal triangle;
* a block from a later rank: every key is later, nothing to compute (but the
  block is still passed on: the next rank may need it).

`block_attention(q, k, v, causal)` (given) computes one block's partial. Merge
it into the running (out, lse), pass K and V on, and return
``(out, lse, k_next, v_next)``. The grader starts each rank at out = 0,
lse = −inf, calls your step n times, and after the last compares with causal
attention over the whole sequence computed on one process.

What you need: ``torch.maximum``, ``torch.exp``, ``torch.log`` (or
``torch.logaddexp``); ``mt.comm.sendrecv(x, dst, out, src)`` (send x to global
rank dst while receiving into the buffer `out` from src: a ring of these cannot
deadlock); ``axis.rank``, ``axis.size``, ``axis.next``, ``axis.prev``.

minitp's own ring (`mt.context_parallel.ring_attention`) splits the sequence in
2n chunks so that every rank does the same work (lesson 08 measures why), and
posts the next block before computing with this one; the merge is the same.

Grade it with `mt.grade("ex08")` in a notebook or `python -m minitp.course.grade ex08`:
the merge in float64 against the softmax over all the keys (scores of ±1000
included), then the ring at cp = 2 and 4 on real processes, every step checked.
"""

import math

import torch

import minitp as mt


def merge(out1, lse1, out2, lse2):
    """The partial attention over the keys of both blocks: (out, lse)."""
    # BEGIN SOLUTION
    # hint: ℓ = log(e^ℓ₁ + e^ℓ₂) computed as m + log(e^(ℓ₁−m) + e^(ℓ₂−m)) with m the larger
    # hint: (or torch.logaddexp); then weight each output by e^(ℓ_b − ℓ) (unsqueeze(-1))
    lse = torch.logaddexp(lse1, lse2)
    out = (torch.exp(lse1 - lse).unsqueeze(-1) * out1
           + torch.exp(lse2 - lse).unsqueeze(-1) * out2)
    return out, lse
    # END SOLUTION


def block_attention(q, k, v, causal: bool):
    """One block's partial: softmax over this block's keys only, and its log-sum-exp.
    `causal`: q and k are the same positions (keep key j <= query i)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = scores.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def ring_step(q, k, v, out, lse, step: int, axis: mt.Axis):
    """Step `step` of the ring on this rank: merge the block it holds, pass K/V on.
    Returns (out, lse, k_next, v_next)."""
    # BEGIN SOLUTION
    # hint: the block came from rank (axis.rank - step) % axis.size; earlier: all of it,
    # hint: this rank's own: causal, later: skip. Then send k and v to axis.next and
    # hint: receive the next ones from axis.prev (mt.comm.sendrecv, buffers torch.empty_like)
    src = (axis.rank - step) % axis.size
    if src <= axis.rank:
        partial = block_attention(q, k, v, causal=src == axis.rank)
        out, lse = merge(out, lse, *partial)
    if step == axis.size - 1:  # every rank has seen every block: no hop left to make
        return out, lse, k, v
    k_next = mt.comm.sendrecv(k, axis.next, torch.empty_like(k), axis.prev)
    v_next = mt.comm.sendrecv(v, axis.next, torch.empty_like(v), axis.prev)
    return out, lse, k_next, v_next
    # END SOLUTION
