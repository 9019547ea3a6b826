"""A vision-language model's encoder on a tensor-parallel group: the two layouts of
lesson 15's source (a notes file on Megatron-LM's tensor parallelism, §5 "Multi-GPU VLM
training": djwar42/arr-coc-0-1, `.claude/skills/karpathy-deep-oracle/karpathy/
distributed-training/02-megatron-lm-tensor-parallelism.md`) — the decoder tensor-parallel
either way.

* "replicated": every tp rank holds the whole (small) encoder and runs it on the whole
  image. Without sequence parallelism the decoder's residual stream is replicated, so
  the image tokens' gradient arrives whole on every rank and the replicas stay equal
  with no communication. With sequence parallelism each rank places only the image
  tokens inside its slice of the sequence: its encoder gradients are one term of the
  sum, so they are tagged ``grad_partial_over_tp`` and summed over tp with the other
  partial gradients (`partial_grads.py`) — forget it and the replicas drift apart.
* "tensor": the encoder's blocks split as the decoder's (qkv and fc by columns, the
  projections by rows): 1/t of its weights and FLOPs per rank, for two all-reduces of
  (B, P, w) forward and two backward per encoder layer. Its outputs are replicated;
  under sequence parallelism they are copied to the ranks (f: all-reduce backward)
  before each takes its slice, since a split weight needs the whole gradient, which no
  later sum of the weights' gradients can rebuild.

Patch embedding, positions, LayerNorms and projector stay whole in both (as Megatron's
LayerNorms): tiny, and their gradients follow the rule of the layout.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..runtime.mesh import Axis
from ..sharding.plan import apply_plan
from ..sharding.tags import set_tags
from . import mappings
from .dropout import ShardedDropout
from .layers import ColumnParallelLinear, RowParallelLinear


class SequenceShardedPlace(nn.Module):
    """`minitp.model.vision.PlacePrefix` on a sequence-parallel rank: the image tokens that fall
    in this rank's slice of the sequence, in place of its first token embeddings."""

    def __init__(self, axis: Axis, whole_grad: bool):
        super().__init__()
        self.axis, self.whole_grad = axis, whole_grad

    def forward(self, image, x):  # (B, P, C) replicated, (B, T/t, C) this rank's slice
        if self.whole_grad:  # every rank gets the image tokens' whole gradient back
            image = mappings.copy_to_parallel(image, self.axis)
        local = x.shape[1]
        start = self.axis.rank * local
        mine = max(0, min(image.shape[1] - start, local))  # image positions in this slice
        if not mine:  # still a (zero) gradient for the encoder, as on the other ranks: the
            return x + image[:, :0].sum()  # partial gradients are summed over tp by all ranks
        return torch.cat([image[:, start:start + mine], x[:, mine:]], dim=1)


def _column(m, tp):
    return ColumnParallelLinear.from_dense(m, tp)  # no sequence parallelism in the encoder


def _row(m, tp):
    return RowParallelLinear.from_dense(m, tp)


def _dropout(m, tp):
    return ShardedDropout.from_dense(m, tp)


# What the encoder's modules become under the "tensor" layout.
VISION_TENSOR_PARALLEL_PLAN = [
    ("vision.blocks.*.attn.qkv", _column),
    ("vision.blocks.*.attn.core.dropout", _dropout),
    ("vision.blocks.*.attn.proj", _row),
    ("vision.blocks.*.mlp.fc", _column),
    ("vision.blocks.*.mlp.proj", _row),
]


def apply_vision_parallel(model: nn.Module, tp: Axis, sequence_parallel: bool,
                          layout: str) -> None:
    """Lay the encoder of `model` (a plain vision-language GPT, changed in place) over tp."""
    if not model.cfg.vision_patches or tp.size == 1:
        return
    if layout == "tensor":
        apply_plan(model, VISION_TENSOR_PARALLEL_PLAN, (tp,))
    if sequence_parallel:
        model.vision.place = SequenceShardedPlace(tp, whole_grad=layout == "tensor")
        if layout == "replicated":
            for p in model.vision.parameters():
                set_tags(p, grad_partial_over_tp=True)
