# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex25
# Made from solutions/ex25_dtensor_placements.py by `python -m minitp.course.make_exercises`.
"""Exercise 25: what each rank keeps, read from DTensor's placements, for a model lesson 25
did not print.

Lesson 25 printed the placements PyTorch gave minitp's GPT. This model is another: one
Llama block as PyTorch's tensor-parallel tutorial shards it (pytorch/tutorials,
`intermediate_source/TP_tutorial.rst`, its plan with sequence parallelism), with a
vocabulary of 49 tokens that no tp divides (GPT-2's 50,257 is odd too). Its parameters,
named as `named_parameters()` names them, and their shapes are `SHAPES` below; the plan
given to `parallelize_module` is

    "tok_embeddings":                     RowwiseParallel(input_layouts=Replicate(),
                                                          output_layouts=Shard(1))
    "layers.0.attention_norm", "layers.0.ffn_norm", "norm":   SequenceParallel()
    "layers.0.attention.wq", ".wk", ".wv":                    ColwiseParallel()
    "layers.0.attention.wo":              RowwiseParallel(output_layouts=Shard(1))
    "layers.0.feed_forward.w1", ".w3":                        ColwiseParallel()
    "layers.0.feed_forward.w2":           RowwiseParallel(output_layouts=Shard(1))
    "output":                             ColwiseParallel(input_layouts=Shard(1),
                                                          use_local_output=False)

nn.Linear keeps its weight as (out_features, in_features) and computes x @ W.T; nn.Embedding
keeps (num_embeddings, embedding_dim), and its input, a token id, picks one of those rows.
The norms are RMSNorms (a weight, no bias).

(a) `tp_placements()`: {name: the placement of that parameter on the tp mesh dimension, as
    `parallelize_module` leaves it} for every name in SHAPES: Shard(d) or Replicate().
(b) `local_shape(shape, placements, mesh_shape, coord)`: the shape of the piece that the rank
    at mesh coordinate `coord` holds of a tensor of global `shape` placed by `placements`
    (one Shard(d) or Replicate() per mesh dimension, in the mesh's order). DTensor's
    documentation says a Shard cuts as `torch.chunk` does: find what that means for 5 rows
    over 4 ranks, and for a dim that two mesh dimensions both shard.
(c) `kept_bytes(dp, tp, dp_rank, tp_rank, itemsize)`: the bytes of SHAPES' parameters that
    the rank at (dp_rank, tp_rank) keeps on a mesh (dp, tp), tp fastest as in lesson 25:
    `parallelize_module` with the plan above on tp, then FSDP2's `fully_shard` on dp
    (dp = 1: no fully_shard; tp = 1: no parallelize_module). FSDP2 cuts each parameter's
    *local* tensor, what tensor parallelism left on the rank, along its dim 0, as
    `torch.chunk` does (that is the `_StridedShard` lesson 25 printed).

Grade it with `mt.grade("ex25")` in a notebook or `python -m minitp.course.grade ex25`: one
launch of 4 ranks applies the plan and FSDP2 for real and compares (a) with the placements
PyTorch gave, (b) with every rank's `distribute_tensor(...).to_local()` on a 4-rank and a
2 × 2 mesh, and (c) with the bytes each rank holds for meshes (1, 4), (2, 2) and (4, 1).
"""

import math

from torch.distributed.tensor import Replicate, Shard

SHAPES = {
    "tok_embeddings.weight": (49, 8),
    "layers.0.attention_norm.weight": (8,),
    "layers.0.attention.wq.weight": (8, 8),
    "layers.0.attention.wk.weight": (4, 8),  # 2 key/value heads of 2: grouped-query attention
    "layers.0.attention.wv.weight": (4, 8),
    "layers.0.attention.wo.weight": (8, 8),
    "layers.0.ffn_norm.weight": (8,),
    "layers.0.feed_forward.w1.weight": (24, 8),
    "layers.0.feed_forward.w2.weight": (8, 24),
    "layers.0.feed_forward.w3.weight": (24, 8),
    "norm.weight": (8,),
    "output.weight": (49, 8),
}


def tp_placements() -> dict:
    """{parameter name: its placement on the tp mesh dimension} for every name in SHAPES."""
    # hint: A style splits a module's outputs (Colwise) or its inputs (Rowwise): which dim of
    # hint: the weight holds them, for an nn.Linear and for an nn.Embedding? And what does
    # hint: SequenceParallel split: the norm's weight, or the activations it normalises?
    raise NotImplementedError(
        "A style splits a module's outputs (Colwise) or its inputs (Rowwise): which dim of "
        'the weight holds them, for an nn.Linear and for an nn.Embedding? And what does '
        "SequenceParallel split: the norm's weight, or the activations it normalises?"
    )


def local_shape(shape, placements, mesh_shape, coord) -> tuple:
    """The shape of the piece the rank at mesh coordinate `coord` holds."""
    # hint: torch.chunk(torch.arange(5), 4) shows how a dim is cut. Mesh dimensions cut in
    # hint: order: when two shard the same dim, what does the second one cut?
    raise NotImplementedError(
        'torch.chunk(torch.arange(5), 4) shows how a dim is cut. Mesh dimensions cut in '
        'order: when two shard the same dim, what does the second one cut?'
    )


def kept_bytes(dp: int, tp: int, dp_rank: int, tp_rank: int, itemsize: int) -> int:
    """Bytes of SHAPES' parameters on the rank at (dp_rank, tp_rank) of a mesh (dp, tp)."""
    # hint: For each parameter: the piece tensor parallelism leaves (its placement, a 1-D
    # hint: mesh of tp), then FSDP2's cut of that piece's dim 0 over dp. Sum the elements.
    raise NotImplementedError(
        'For each parameter: the piece tensor parallelism leaves (its placement, a 1-D mesh '
        "of tp), then FSDP2's cut of that piece's dim 0 over dp. Sum the elements."
    )
