# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex10
# Made from solutions/ex10_ulysses_all_to_all.py by `python -m minitp.course.make_exercises`.
"""Exercise 10: Ulysses' two all-to-alls.

Under context parallelism every rank of the cp group (`axis`, cp ranks) holds its share
of the sequence, in the load-balanced split of lesson 08: the sequence cut into 2·cp
equal chunks, rank r holding chunks r and 2·cp − 1 − r, early one first. Ulysses
(DeepSpeed's all-to-all attention, Megatron-LM's ``--cp-comm-type a2a``) trades that for
a split by heads just around attention: after one all-to-all each rank holds the WHOLE
sequence of 1/cp of the heads, runs ordinary causal attention on it, and a second
all-to-all trades back.

Part (a): `heads_to_sequence(x, axis)`. x (B, heads, L, d): every head of this rank's L
positions (its two chunks, early one first). Return (B, heads/cp, cp·L, d): rank r's
share of the heads (the r-th of cp equal, consecutive groups), at every position of the
sequence, in the sequence's own order: the causal mask that runs next reads a key's
place from its index.

Part (b): `sequence_to_heads(y, axis)`: the way back, for attention's output. y (B,
heads/cp, cp·L, d) as (a) returns it; return (B, heads, L, d) as (a) took it: every
head, this rank's two chunks, early one first, where the rest of the model expects them.

Part (c): grouped-query attention. K and V may have fewer heads than the queries (each
K/V head read by a group of consecutive query heads). `kv_for_all_to_all(k, cp)`
returns what (a) should be given for K (or V), k (B, n_kv, L, d): if the all-to-all can
split the K/V heads like the queries, k itself; if cp is a multiple of n_kv, each rank
must still receive the one K/V head its query heads read. Which head is that, for rank
r, and what must k look like so that (a)'s split hands it over?

What you may use: ``mt.comm.all_to_all(x, axis, send_splits, recv_splits)``: rank r
sends the k-th run of ``send_splits[k]`` rows of x (dim 0) to the k-th rank of `axis`
and returns the rows every rank sent it, in rank order (``recv_splits[s]`` from the
s-th); torch's ``chunk``, ``stack``, ``cat``, ``unbind``, ``repeat_interleave``;
``axis.rank``, ``axis.size``. No autograd is needed: the all-to-all's gradient is the
reverse all-to-all, so the grader runs (b) backward where (a) ran forward, and (a)
where (b) did.

Work it out on paper first, cp = 2: which positions does each rank hold, which does it
send to whom, in what order do they arrive, and where does each sit in the sequence?

Grade it with `mt.grade("ex10")` in a notebook or `python -m minitp.course.grade ex10`:
at cp = 2 and 4 on real processes, in float64: (a) and (b) against the split's own
layout, (c) on four K/V head counts, then your three functions as the all-to-alls of
Ulysses attention in a Llama-style GPT (grouped-query), whose loss and gradients must
equal one device's.
"""

import torch

import minitp as mt


def heads_to_sequence(x: torch.Tensor, axis: mt.Axis) -> torch.Tensor:
    """(B, heads, L, d) this rank's two chunks -> (B, heads/cp, cp·L, d) in sequence order."""
    cp = axis.size
    # hint: Which dimension do you cut into cp parts, and which rank gets each part? What
    # hint: arrives from rank j, and which two chunks of the sequence are those positions?
    # hint: In which order must the 2·cp chunks stand when you put them together?
    raise NotImplementedError(
        'Which dimension do you cut into cp parts, and which rank gets each part? What '
        'arrives from rank j, and which two chunks of the sequence are those positions? In '
        'which order must the 2·cp chunks stand when you put them together?'
    )


def sequence_to_heads(y: torch.Tensor, axis: mt.Axis) -> torch.Tensor:
    """(B, heads/cp, cp·L, d) in sequence order -> (B, heads, L, d) this rank's two chunks."""
    cp = axis.size
    # hint: Rank j needs its own positions back, of every head: which of the 2·cp chunks,
    # hint: in which order? And in which order do the head groups that arrive stack up?
    raise NotImplementedError(
        'Rank j needs its own positions back, of every head: which of the 2·cp chunks, in '
        'which order? And in which order do the head groups that arrive stack up?'
    )


def kv_for_all_to_all(k: torch.Tensor, cp: int) -> torch.Tensor:
    """(B, n_kv, L, d) -> what `heads_to_sequence` takes for K or V (B, n_kv or cp, L, d)."""
    n_kv = k.shape[1]
    # hint: When does cp divide the K/V heads? If it does not, which K/V head do rank r's
    # hint: query heads read, and which head of the tensor you return does (a) send rank r?
    raise NotImplementedError(
        "When does cp divide the K/V heads? If it does not, which K/V head do rank r's query "
        'heads read, and which head of the tensor you return does (a) send rank r?'
    )
