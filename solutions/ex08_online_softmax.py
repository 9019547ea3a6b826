"""Exercise 08: the online-softmax merge, the load-balanced split, and one step of
ring attention.

Part (a): `merge`. A block's *partial* attention result is a query's
softmax-weighted average over that block's keys alone, O_b, with the block's
log-sum-exp of the scores, ℓ_b = log Σ_j exp(s_j). Lesson 08 derives how two
partials over disjoint keys combine into the softmax over all of them. Write it
on tensors: out (B, heads, n, d), lse (B, heads, n). It must stay finite for
scores of any size (e^ℓ overflows float64 once ℓ passes ~709), and a partial over
no keys at all (ℓ = −inf, O = 0, where the ring starts) must change nothing.

Part (b): the load-balanced split. Under the causal mask a query attends only to
keys at or before it, so a contiguous split gives the last rank the most work and
the first the least. Instead, cut the sequence into 2·cp equal chunks, numbered
0 .. 2·cp − 1 in sequence order; rank r holds chunks r and 2·cp − 1 − r, one early
and one late, early one first. `chunks_of(rank, cp)` names them; `split(x, rank,
cp)` cuts them out of x along dim −2 and returns them concatenated, with their
positions in the whole sequence (a tensor of ints, one per position held).

Part (c): `ring_step`, one step of ring attention on one rank of the cp ring
(`axis`). q, k, v: (B, heads, 2L, d), this rank's two chunks of L positions,
as `split` cuts them; out, lse: this rank's running result, the same rows.
At step 0 every rank holds its own K/V. After each step every rank passes the
K/V it holds to ``axis.next`` and receives a block from ``axis.prev``, so the
blocks go round the ring one rank per step, and after cp steps every rank has
seen every block. Each block that arrives is two chunks, early one first, as its
owner's `split` cut them.

The causal mask, chunk by chunk: one query chunk against one key chunk is a
*block*. Chunks never straddle each other: a key chunk that lies wholly before
the query chunk is attended whole; one that lies wholly after it, not at all
(compute nothing); the same chunk, the causal triangle (key j ≤ query i). Each
step, each of your two query chunks meets each of the two key chunks that have
arrived: work out which of the three it is, compute what the mask keeps with
`block_attention(q_chunk, k_chunk, v_chunk, causal)` (given), and merge it into
that query chunk's running result. (`block_attention` also takes a `keep` mask:
one call on all 2L queries and 2L keys, masked by position, is right too.) The
grader counts the (chunk × chunk) blocks each rank computes with it: they must be
equal on every rank, and it says what computing a block the mask removes whole
costs. Then pass K and V on, and return ``(out, lse, k_next, v_next)``. The
last hop carries no block anyone still needs: make it or skip it, both are right.

Part (d): `block_backward`, the backward of one block. Parts (a)-(c) are forward
only (the grader's check of the ring's backward differentiates your steps with
autograd); a real ring keeps no block's probabilities and writes its own backward,
block by block, as flash attention does: for the queries' rows it keeps out and the
final ℓ (the log-sum-exp over every key), and when a block of K/V comes round it
recomputes that block's share of the softmax from them. Given one block's q
(n queries), k and v (m keys), the final out and lse of those n rows and dout, the
gradient of the loss with respect to out, return what this block adds to the
gradients: (dq, dk, dv), shaped like (q, k, v); `causal` as in `block_attention`.
The grader sums your blocks' shares where their rows belong (dq over the key
blocks a query met; dK and dV over the query blocks a key block met: what the
ring's backward carries home to the K/V's owner) and compares the sums with torch
autograd through the whole attention, in float64. One fact about the softmax
p = softmax(s) you may use: for a loss with gradient dp, ds_j = p_j (dp_j − Σ_i p_i dp_i).

What you need: ``torch.logaddexp`` (or ``torch.maximum``, ``torch.exp``,
``torch.log``); ``Tensor.chunk``, ``torch.cat``, ``torch.arange``;
``mt.comm.sendrecv(x, dst, out, src)`` (send x to global rank dst while receiving
into the buffer `out` from src: a ring of these cannot deadlock); ``axis.rank``,
``axis.size``, ``axis.next``, ``axis.prev``.

minitp's own ring (`mt.context_parallel.ring_attention`) does the same, and posts
the next block before computing with this one.

Grade it with `mt.grade("ex08")` in a notebook or `python -m minitp.course.grade ex08`:
the merge in float64 against the softmax over all the keys (scores of ±1000
included); the split at cp = 2 and 4; the ring at cp = 2 and 4 on real processes,
every step checked, and the blocks each rank computed counted; then the backward
through your steps (autograd): the gradients of q, and of each K/V block summed at its
owner (the gradients going home), against causal attention's, in float64; and your
block backward, in this process, block by block, against autograd.
"""

import math

import torch

import minitp as mt


def merge(out1, lse1, out2, lse2):
    """The partial attention over the keys of both blocks: (out, lse)."""
    # BEGIN SOLUTION
    # hint: the whole log-sum-exp first, computed without ever forming e^ℓ (or torch.logaddexp);
    # hint: then each output weighted by its block's share of the softmax's mass
    lse = torch.logaddexp(lse1, lse2)
    out = (torch.exp(lse1 - lse).unsqueeze(-1) * out1
           + torch.exp(lse2 - lse).unsqueeze(-1) * out2)
    return out, lse
    # END SOLUTION


def chunks_of(rank: int, cp: int) -> tuple[int, int]:
    """The numbers of the two chunks (of 2·cp) that cp rank `rank` holds, early one first."""
    # BEGIN SOLUTION
    # hint: one chunk counted from the start of the sequence, one from its end
    return rank, 2 * cp - 1 - rank
    # END SOLUTION


def split(x, rank: int, cp: int):
    """This rank's two chunks of x along dim -2, concatenated, and their positions."""
    # BEGIN SOLUTION
    # hint: x.chunk(2 * cp, dim=-2) cuts the chunks; positions count from the start of the
    # hint: whole sequence, not from this rank's first token
    chunks = x.chunk(2 * cp, dim=-2)
    length = chunks[0].shape[-2]
    mine = chunks_of(rank, cp)
    positions = torch.cat([torch.arange(c * length, (c + 1) * length, device=x.device)
                           for c in mine])
    return torch.cat([chunks[c] for c in mine], dim=-2), positions
    # END SOLUTION


def block_attention(q, k, v, causal: bool, keep=None):
    """A partial: softmax over these keys only, and its log-sum-exp. `causal`: q and k are
    the same positions (keep key j <= query i). `keep`, instead: a (queries, keys) bool
    tensor, True where query i may see key j; a query that sees none gets out 0, lse -inf
    (an empty partial, which the merge ignores)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = scores.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    if keep is None:
        lse = torch.logsumexp(scores, dim=-1)
        return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse
    empty = ~keep.any(dim=-1)  # rows with no key: made finite here, emptied below
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(empty.unsqueeze(-1), 0.0)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse.unsqueeze(-1)) @ v
    return out.masked_fill(empty.unsqueeze(-1), 0.0), lse.masked_fill(empty, float("-inf"))


def ring_step(q, k, v, out, lse, step: int, axis: mt.Axis):
    """Step `step` of the ring on this rank: merge the blocks the causal mask keeps of
    the K/V it holds, pass K/V on. Returns (out, lse, k_next, v_next)."""
    # BEGIN SOLUTION
    # hint: whose K/V is this, after `step` moves round the ring? Number your chunks and its
    # hint: chunks; each (query chunk, key chunk) pair is whole, a triangle or nothing.
    # hint: Then sendrecv k and v on (buffers: torch.empty_like)
    owner = (axis.rank - step) % axis.size
    mine, theirs = chunks_of(axis.rank, axis.size), chunks_of(owner, axis.size)
    qs, ks, vs = q.chunk(2, dim=-2), k.chunk(2, dim=-2), v.chunk(2, dim=-2)
    outs, lses = list(out.chunk(2, dim=-2)), list(lse.chunk(2, dim=-1))
    for a in range(2):
        for b in range(2):
            if theirs[b] > mine[a]:
                continue  # every key after every query
            partial = block_attention(qs[a], ks[b], vs[b], causal=theirs[b] == mine[a])
            outs[a], lses[a] = merge(outs[a], lses[a], *partial)
    out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)
    if step == axis.size - 1:  # every rank has seen every block: no hop left to make
        return out, lse, k, v
    k_next = mt.comm.sendrecv(k, axis.next, torch.empty_like(k), axis.prev)
    v_next = mt.comm.sendrecv(v, axis.next, torch.empty_like(v), axis.prev)
    return out, lse, k_next, v_next
    # END SOLUTION


def block_backward(q, k, v, out, lse, dout, causal: bool):
    """What one block adds to the gradients, (dq, dk, dv): q (B, heads, n, d) its queries,
    k and v (B, heads, m, d) its keys and values; out, lse and dout the final ones of those
    n rows (over every key, not this block's)."""
    # BEGIN SOLUTION
    # hint: which share of each query's softmax is this block's, given the final lse? And the
    # hint: softmax's sum over every key, which no block holds: what do the final out and dout
    # hint: give of it?
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if causal:
        n = scores.shape[-1]
        above = ~torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(above, float("-inf"))
    p = torch.exp(scores - lse.unsqueeze(-1))  # this block's share of the final softmax
    delta = (dout * out).sum(-1, keepdim=True)  # Σ_j p_j dp_j, every key: dout · out
    ds = p * (dout @ v.transpose(-2, -1) - delta)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ dout
    # END SOLUTION
