# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex18
# Made from solutions/ex18_tp_decode_step.py by `python -m minitp.course.make_exercises`.
"""Exercise 18: a tensor-parallel decode step, with its KV cache.

Decoding makes one token per sequence per step. The new token's attention needs the keys
and values of every earlier position: the KV cache keeps them, so each step computes only
its own K and V, writes them into the cache, and reads the rest.

The attention block here is a Llama-style one with grouped-query attention, written with
plain tensors: H query heads and K K/V heads of size d (query head j reads K/V head
j // (H/K): groups of H/K consecutive query heads share one), no biases, no rotary
positions (a position is its slot in the cache: slot p holds position p's K and V).

Under tensor parallelism over `axis` (t ranks), rank r holds the query heads
r·H/t … (r+1)·H/t − 1: wq's columns of those heads (h, H/t·d), wo's rows of them
(H/t·d, h). Of the K/V projections and the cache it keeps only what its own query heads
read: wk's and wv's columns (h, K_r·d) of those K/V heads, no more, where K_r is how many
there are. t divides H, and either t divides K or K divides t (`minitp.rules` refuses the
rest). Work out which K/V heads those are on a few small cases before you write the rule:
H = 8, K = 2 at t = 2, and at t = 4; H = 8, K = 8 at t = 2. What happens when t is larger
than K, and does the answer depend on H?

Part (a): `cache_heads(n_kv_head, tp, rank)`: the K/V heads (a list of ints, ascending)
whose cache rank `rank` keeps.

Part (b): `new_cache(batch, max_len, n_kv_head, head_dim, axis)`: this rank's empty cache,
a pair (k, v) of zero tensors (batch, K_r, max_len, head_dim), float64, on `mt.device()`.

Part (c): `decode_step(x, w, cache, pos, axis)`. x (B, 1, h): the new token's input, the
same on every rank; w: this rank's shards, a dict of wq (h, H/t·d), wk and wv (h, K_r·d),
wo (H/t·d, h); cache: (b)'s pair, holding positions 0 … pos − 1; pos: the new token's
position. Return the attention block's output for the new token, (B, 1, h), the same on
every rank, and leave the cache holding positions 0 … pos. Communicate as little as this
layout allows: the grader counts each step's collectives (`mt.comm`), and the fewest that
give the right output pass its check (d).

Grade it with `mt.grade("ex18")` in a notebook or `python -m minitp.course.grade ex18`:
at t = 2 and t = 4 (8 query heads, 2 K/V heads), float64, on real processes, each step's
output against one device's attention over the whole sequence at once.
"""

import math

import torch

import minitp as mt


def cache_heads(n_kv_head: int, tp: int, rank: int) -> list[int]:
    """The K/V heads whose cache tp rank `rank` keeps."""
    # hint: Which query heads does the rank hold, and which K/V head does each read?
    # hint: List them for the small cases in the docstring, then find the rule
    raise NotImplementedError(
        'Which query heads does the rank hold, and which K/V head does each read? List them '
        'for the small cases in the docstring, then find the rule'
    )


def new_cache(batch: int, max_len: int, n_kv_head: int, head_dim: int,
              axis: mt.Axis) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's empty cache: (k, v), each (batch, K_r, max_len, head_dim)."""
    # hint: How many K/V heads does this rank keep (part (a))? Only those take memory here.
    raise NotImplementedError(
        'How many K/V heads does this rank keep (part (a))? Only those take memory here.'
    )


def decode_step(x: torch.Tensor, w: dict, cache: tuple, pos: int,
                axis: mt.Axis) -> torch.Tensor:
    """One token through this rank's heads, its K/V into slot `pos`, summed over `axis`."""
    k_cache, v_cache = cache
    batch, _, head_dim = k_cache.shape[0], k_cache.shape[1], k_cache.shape[3]
    # hint: Project q, k, v with this rank's shards and split them into heads. Into which
    # hint: slot of the cache go this token's K and V, and which slots does its query read?
    # hint: Which K/V head does each local query head read? After wo's rows, what does
    # hint: this rank hold of the output, and what must the ranks do with it?
    raise NotImplementedError(
        "Project q, k, v with this rank's shards and split them into heads. Into which slot "
        "of the cache go this token's K and V, and which slots does its query read? Which K/V"
        " head does each local query head read? After wo's rows, what does this rank hold of "
        'the output, and what must the ranks do with it?'
    )
