"""Exercise 14: what each rank writes, and what each reads, when a ZeRO-1, tp = 2
checkpoint is loaded at tp = 1, dp = 4.

Lesson 14 saved a run as shards and loaded it at another layout. Here you say who writes
what and who reads what, for any GPT's parameter table, in the format minitp's sharded
checkpoint uses (`minitp.checkpoint.sharded`):

* every rank r writes one file, ``rank_file(r)`` ("rank-<r>.bin"), with global rank
  r = dp_rank · tp + tp_rank (tp fastest, as ``mt.Mesh`` numbers them);
* each element of the model and of Adam's state is written ONCE, by the LOWEST global
  rank that holds it: a replica never writes what another already wrote;
* a file says what it holds as ``{tensor: runs}``: each run (start, stop) a range of the
  DENSE tensor's flat (row-major) elements. Tensors: "model/<name>" (the parameter),
  "exp_avg/<name>" and "exp_avg_sq/<name>" (Adam's state of it). A rank that loads asks
  each file for runs the same way.

What each rank holds. Tensor parallelism: the table lists ``Param(name, shape, rule)`` in
the model's order; rule is "column" (``nn.Linear``'s weight is (out, in); a
column-parallel layer splits its outputs), "row" (splits its inputs), "vocab" (the
embedding's rows) or None (replicated: a LayerNorm, the positions, a row-parallel bias).
A split is into tp equal, contiguous blocks. ZeRO-1 (lesson 13, ``Zero1Optimizer``):
tp rank t lays its blocks end to end, in the table's order, in one flat vector
(`zero1_flat` below), pads it with zeros to a multiple of dp, and dp rank d keeps the
Adam state of elements [d·s, (d+1)·s), s = padded / dp. The loading layout is tp = 1,
ZeRO-1 over new_dp: each rank holds the whole model and its 1/new_dp of the state.

Write:

* ``tp_block(shape, rule, tp_rank, tp)``: the block tp rank ``tp_rank`` holds, as a
  tuple of slices (one per dimension);
* ``state_owner(table, k, element, tp, dp)``: the global rank that writes Adam's state
  of element ``element`` of ``table[k]``;
* ``writes(table, tp_rank, dp_rank, tp, dp)``: ``{file: {tensor: runs}}``, what rank
  (tp_rank, dp_rank) of the saving layout writes;
* ``reads(table, dp_rank, old_tp, old_dp, new_dp)``: ``{file: {tensor: runs}}``, what
  rank dp_rank of the loading layout reads: its whole model and its ZeRO-1 shard of the
  state, each element once, from the file that holds it, and nothing else.

The grader builds the layout from minitp's own tensor-parallel layers and ZeRO-1's flat
shards, and checks your functions on two models and layouts (one of them this one: tp 2,
dp 2 → tp 1, dp 4). It names the usual slips: the split on the wrong dimension, a
replica writing what another wrote, a state read from the wrong dp rank, a rank reading
whole files. Grade it with ``mt.grade("ex14")`` or ``python -m minitp.course.grade ex14``.
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple

import torch

Param = namedtuple("Param", "name shape rule")


def rank_file(rank: int) -> str:
    return f"rank-{rank}.bin"


def global_rank(tp_rank: int, dp_rank: int, tp: int) -> int:
    return dp_rank * tp + tp_rank


def dense_ids(shape, block) -> torch.Tensor:
    """The dense tensor's flat (row-major) element numbers inside `block`, in order."""
    return torch.arange(math.prod(shape)).view(*shape)[block].flatten()


def runs(ids) -> list[tuple[int, int]]:
    """Increasing element numbers as runs [(start, stop), ...]."""
    out = []
    for i in (int(x) for x in ids):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def zero1_flat(table, tp_rank: int, tp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ZeRO-1's flat vector on tp rank `tp_rank`, before its padding: for each element,
    (which parameter of the table, which dense element of it): (owner, ids), two tensors.
    It calls your `tp_block`; at tp = 1 it is the dense parameters end to end."""
    return _flat(tuple(table), tp_rank, tp)


@functools.lru_cache(maxsize=64)
def _flat(table, tp_rank, tp):
    owner, ids = [], []
    for k, p in enumerate(table):
        block = dense_ids(p.shape, tp_block(p.shape, p.rule, tp_rank, tp))
        owner.append(torch.full_like(block, k))
        ids.append(block)
    return torch.cat(owner), torch.cat(ids)


def state_runs(table, owner, ids) -> dict:
    """{"exp_avg/<name>": runs, "exp_avg_sq/<name>": runs} of the elements (owner[i], ids[i])
    (each parameter's ids increasing, as in `zero1_flat`)."""
    owner, ids = torch.as_tensor(owner, dtype=torch.long), torch.as_tensor(ids, dtype=torch.long)
    out = {}
    for key in ("exp_avg", "exp_avg_sq"):
        for k in sorted(set(owner.tolist())):
            out[f"{key}/{table[k].name}"] = runs(ids[owner == k])
    return out


def tp_block(shape, rule, tp_rank: int, tp: int) -> tuple[slice, ...]:
    """The block of a dense tensor of `shape` that tensor-parallel rank `tp_rank` holds."""
    # BEGIN SOLUTION
    # hint: What does each rule split: y = x Wᵀ's outputs, its inputs, the vocabulary?
    # hint: And which dimension of the stored weight is that?
    whole = tuple(slice(None) for _ in shape)
    if rule is None:
        return whole
    dim = 1 if rule == "row" else 0  # column and vocab: the outputs (rows); row: the inputs
    size = shape[dim] // tp
    block = list(whole)
    block[dim] = slice(tp_rank * size, (tp_rank + 1) * size)
    return tuple(block)
    # END SOLUTION


def state_owner(table, k: int, element: int, tp: int, dp: int) -> int:
    """The global rank that writes Adam's state of element `element` of ``table[k]``."""
    # BEGIN SOLUTION
    # hint: Which ranks hold Adam's state of this element: on which tp ranks is it, and
    # hint: on each, which dp rank's ZeRO-1 shard? Which of them does the write rule pick?
    holders = []
    for t in range(tp):
        owner, ids = zero1_flat(table, t, tp)
        at = torch.nonzero((owner == k) & (ids == element)).flatten()
        if at.numel():
            size = -(-len(ids) // dp)  # the shard size of the padded flat vector
            holders.append(global_rank(t, int(at[0]) // size, tp))
    return min(holders)
    # END SOLUTION


def writes(table, tp_rank: int, dp_rank: int, tp: int, dp: int) -> dict:
    """{file: {tensor: runs}} that rank (tp_rank, dp_rank) of the saving layout writes."""
    # BEGIN SOLUTION
    # hint: What does this rank hold, of the model and of the state? Who else holds each
    # hint: piece, and is this rank the one the write rule picks?
    me = global_rank(tp_rank, dp_rank, tp)
    out = {}
    if dp_rank == 0:  # the dp replicas hold the same blocks: the lowest, dp rank 0, writes
        for p in table:
            if p.rule is not None or tp_rank == 0:  # replicated: rank 0 holds it too
                block = tp_block(p.shape, p.rule, tp_rank, tp)
                out[f"model/{p.name}"] = runs(dense_ids(p.shape, block))
    owner, ids = zero1_flat(table, tp_rank, tp)
    size = -(-len(ids) // dp)
    shard = slice(dp_rank * size, (dp_rank + 1) * size)
    mine = [(k, e) for k, e in zip(owner[shard].tolist(), ids[shard].tolist(), strict=True)
            if table[k].rule is not None or state_owner(table, k, e, tp, dp) == me]
    out.update(state_runs(table, [k for k, _ in mine], [e for _, e in mine]))
    return {rank_file(me): out}
    # END SOLUTION


def reads(table, dp_rank: int, old_tp: int, old_dp: int, new_dp: int) -> dict:
    """{file: {tensor: runs}} that rank dp_rank of the loading layout (tp 1, ZeRO-1 over
    new_dp) reads from a checkpoint written at (old_tp, old_dp)."""
    # BEGIN SOLUTION
    # hint: What does a rank of the loading layout hold, of the model and of the state?
    # hint: For each piece of it, which old rank wrote it, so which file has it?
    out = {}
    for t in range(old_tp):
        writer = rank_file(global_rank(t, 0, old_tp))
        for p in table:
            if p.rule is not None or t == 0:
                block = tp_block(p.shape, p.rule, t, old_tp)
                out.setdefault(writer, {})[f"model/{p.name}"] = runs(dense_ids(p.shape, block))
    owner, ids = zero1_flat(table, 0, 1)  # the new layout's flat vector: the dense parameters
    size = -(-len(ids) // new_dp)
    part = slice(dp_rank * size, (dp_rank + 1) * size)
    by_file = {}
    for k, e in zip(owner[part].tolist(), ids[part].tolist(), strict=True):
        writer = rank_file(state_owner(table, k, e, old_tp, old_dp))
        by_file.setdefault(writer, []).append((k, e))
    for writer, items in by_file.items():
        items.sort()
        out.setdefault(writer, {}).update(
            state_runs(table, [k for k, _ in items], [e for _, e in items]))
    return out
    # END SOLUTION
