# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex14
# Made from solutions/ex14_sharded_checkpoint.py by `python -m minitp.course.make_exercises`.
"""Exercise 14: what each rank writes, and what each reads, when a ZeRO-1, tp = 2
checkpoint is loaded at tp = 1, dp = 4.

Lesson 14 saved a run as shards, one writer per piece, and loaded it at another layout.
Here you say who writes what and who reads what, for any GPT's parameter table.

The checkpoint's format (self-contained here; lesson 14 shows minitp's own, which labels
its files the same way: by the dense tensors' elements they hold):

* ``model_file(t)`` ("model-tp{t}.pt"): tensor-parallel rank t's block of every split
  parameter, and, in ``model_file(0)`` only, the replicated ones (a LayerNorm, the learned
  positions, a row-parallel bias: whole on every rank).
* ``optim_file(t, d)`` ("optim-tp{t}-dp{d}.pt"): rank (tp t, dp d)'s ZeRO-1 shard of Adam's
  ``exp_avg`` and ``exp_avg_sq``. ZeRO-1 (lesson 13, ``Zero1Optimizer``) lays tp rank t's
  parameters (its blocks, in the table's order) end to end in one flat vector, pads it
  with zeros to a multiple of dp, and dp rank d keeps elements [d·s, (d+1)·s), s =
  padded / dp. Its state there is named "exp_avg/<name>" and "exp_avg_sq/<name>".

A file says what it holds as ``{tensor: runs}``: each run (start, stop) a range of the
DENSE tensor's flat (row-major) elements, in the order stored. A rank that loads asks a
file for runs the same way. The parameter table lists ``Param(name, shape, rule)`` in the
model's order; rule is "column" (``nn.Linear``'s weight is (out, in) and a column-parallel
layer splits its outputs), "row" (splits its inputs), "vocab" (the embedding's rows:
vocabulary entries) or None (replicated). Each split is into tp equal, contiguous blocks.

Write:

* ``tp_block(shape, rule, tp_rank, tp)``: the block of the dense tensor that tp rank
  ``tp_rank`` holds, as a tuple of slices (one per dimension);
* ``writes(table, tp_rank, dp_rank, tp, dp)``: ``{file: {tensor: runs}}``, what the rank
  (tp_rank, dp_rank) of the saving layout writes. Every byte of the state is written
  once, by one rank: a replica never writes what another already wrote;
* ``reads(table, dp_rank, old_tp, old_dp, new_dp)``: ``{file: {tensor: runs}}``, what
  rank dp_rank of the loading layout (tp = 1, ZeRO-1 over new_dp) reads: its whole model
  (tp = 1), and its own ZeRO-1 shard of the state (laid out as above, over the dense
  parameters), each element once, from a file that holds it, and nothing else.

The grader builds the layout from minitp's own tensor-parallel layers and ZeRO-1's flat
shards, and checks your three functions on two models and layouts (one of them yours:
tp 2, dp 2 → tp 1, dp 4). It names the usual slips: the split on the wrong dimension, a
replica writing what another wrote, a state read from the wrong dp rank, a rank reading
whole files. Grade it with ``mt.grade("ex14")`` or ``python -m minitp.course.grade ex14``.
"""

from __future__ import annotations

import math
from collections import namedtuple

import torch

Param = namedtuple("Param", "name shape rule")


def model_file(tp_rank: int) -> str:
    return f"model-tp{tp_rank}.pt"


def optim_file(tp_rank: int, dp_rank: int) -> str:
    return f"optim-tp{tp_rank}-dp{dp_rank}.pt"


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
    owner, ids = [], []
    for k, p in enumerate(table):
        block = dense_ids(p.shape, tp_block(p.shape, p.rule, tp_rank, tp))
        owner.append(torch.full_like(block, k))
        ids.append(block)
    return torch.cat(owner), torch.cat(ids)


def state_runs(table, owner: torch.Tensor, ids: torch.Tensor) -> dict:
    """{"exp_avg/<name>": runs, "exp_avg_sq/<name>": runs} of the elements (owner, ids)
    of a flat vector (each parameter's ids increasing, as in `zero1_flat`)."""
    out = {}
    for key in ("exp_avg", "exp_avg_sq"):
        for k in sorted(set(owner.tolist())):
            out[f"{key}/{table[k].name}"] = runs(ids[owner == k])
    return out


def tp_block(shape, rule, tp_rank: int, tp: int) -> tuple[slice, ...]:
    """The block of a dense tensor of `shape` that tensor-parallel rank `tp_rank` holds."""
    # hint: None: the whole tensor. Otherwise one dimension is cut into tp equal blocks:
    # hint: which one? nn.Linear keeps its weight as (out_features, in_features).
    raise NotImplementedError(
        'None: the whole tensor. Otherwise one dimension is cut into tp equal blocks: which '
        'one? nn.Linear keeps its weight as (out_features, in_features).'
    )


def writes(table, tp_rank: int, dp_rank: int, tp: int, dp: int) -> dict:
    """{file: {tensor: runs}} that rank (tp_rank, dp_rank) of the saving layout writes."""
    # hint: The model: which ranks hold the same block as this one (the dp replicas; and
    # hint: for a replicated parameter, every tp rank too)? Only one of them writes it.
    # hint: The optimizer: zero1_flat gives tp rank's flat vector; padded to a multiple of
    # hint: dp, which of its elements does this dp rank keep? state_runs names them.
    raise NotImplementedError(
        'The model: which ranks hold the same block as this one (the dp replicas; and for a '
        'replicated parameter, every tp rank too)? Only one of them writes it. The optimizer:'
        " zero1_flat gives tp rank's flat vector; padded to a multiple of dp, which of its "
        'elements does this dp rank keep? state_runs names them.'
    )


def reads(table, dp_rank: int, old_tp: int, old_dp: int, new_dp: int) -> dict:
    """{file: {tensor: runs}} that rank dp_rank of the loading layout (tp 1, ZeRO-1 over
    new_dp) reads from a checkpoint written at (old_tp, old_dp)."""
    # hint: The model: at tp = 1 every parameter whole, from the files that hold its blocks.
    # hint: The optimizer: this rank's slice of the dense flat vector (padded to a multiple
    # hint: of new_dp); for each of its elements, find the old tp rank whose block has it,
    # hint: its position in that tp rank's flat vector, and so the old dp rank's file.
    raise NotImplementedError(
        'The model: at tp = 1 every parameter whole, from the files that hold its blocks. The'
        " optimizer: this rank's slice of the dense flat vector (padded to a multiple of "
        'new_dp); for each of its elements, find the old tp rank whose block has it, its '
        "position in that tp rank's flat vector, and so the old dp rank's file."
    )
