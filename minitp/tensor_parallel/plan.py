"""Tensor (and sequence) parallelism applied to a plain GPT, by a plan table.

Without sequence parallelism (Megatron-LM, Shoeybi et al. 2019), per layer::

    x ─ ln1 ─ f ─ qkv (column) ─ attention on this rank's heads ─ proj (row) ─ g ─ + x
    x ─ ln2 ─ f ─ fc  (column) ─ GELU                           ─ proj (row) ─ g ─ + x

f is identity forward / all-reduce backward, g the reverse: 2 all-reduces
forward and 2 backward per layer. With sequence parallelism (Korthikanti et al.
2022), LayerNorm, dropout and the residual stream stay split along the sequence;
each f becomes an all-gather (reduce-scatter backward) and each g a
reduce-scatter (all-gather backward): the same bytes, and activations 1/t the
size. Parameters applied to sequence shards (LayerNorms, position embedding,
row-parallel biases) then see only part of the batch on each rank, so their
gradients are partial: they carry the tag ``grad_partial_over_tp``
(`minitp.sharding.tags`) and `train_step` sums them over the group — forgetting it is the
bug behind Megatron-LM issue #1446.

Latent attention (`GPTConfig.mla`): its down-projections, their norms and the shared rotary
key's projection replicated, the up-projections split by heads like qkv, the output
row-parallel like proj; the replicas' gradients are partial and tagged (`tag_latent_replicas`).

The model keeps its one forward (`minitp.model.GPT.forward`); this module only
swaps its pieces for sharded ones. The shard takes its weights from the plain
model, so the two compute the same function — which the tests check.
"""

from __future__ import annotations

import torch.nn as nn

from ..model.mla import REPLICATED
from ..rules import check_tp_overlap, kv_layout, loss_chunk_rows
from ..runtime.mesh import Axis
from ..sharding.plan import apply_plan, matches
from ..sharding.tags import set_tags
from . import mappings
from .dropout import ShardedDropout
from .kv_heads import ReplicatedKV
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .loss import vocab_parallel_cross_entropy
from .overlap import OverlappedColumnParallelLinear, OverlappedRowParallelLinear


class SequenceShardedPositions(nn.Module):
    """The position embedding of a sequence-parallel rank: it holds the whole
    table (replicated) and adds the rows of this rank's slice of the sequence — of a packed
    batch's `positions` (B, T), the rows of this slice's positions."""

    def __init__(self, dense: nn.Embedding, axis: Axis):
        super().__init__()
        self.weight, self.axis = dense.weight, axis

    def forward(self, x, positions=None):  # (B, T/t, C): this rank's slice of the sequence
        local = x.shape[1]
        start = self.axis.rank * local
        if start + local > self.weight.shape[0]:
            raise ValueError(f"a sequence of {local * self.axis.size} tokens is longer than "
                             f"seq_len={self.weight.shape[0]}")
        if positions is not None:
            return x + self.weight[positions[:, start:start + local].to(x.device)]
        return x + self.weight[start:start + local]


class VocabParallelOutput(nn.Module):
    """The tied output projection on a tensor-parallel rank: logits for this rank's
    vocabulary rows, (B, T, V'/t). Its input is replicated (f: copy, all-reduce
    backward) or, with sequence parallelism, gathered from the sequence shards
    (all-gather forward; the gradient, one term per rank, reduce-scattered back)."""

    def __init__(self, embedding: VocabParallelEmbedding, axis: Axis, sequence_parallel: bool):
        super().__init__()
        object.__setattr__(self, "embedding", embedding)  # a reference: `wte` owns the weight
        self.axis, self.sequence_parallel = axis, sequence_parallel

    @property
    def weight(self):
        return self.embedding.weight

    def forward(self, x):  # (B, T or T/t, C)
        if self.sequence_parallel:
            x = mappings.gather_from_sequence(x, self.axis, grad_is_partial=True)  # (B, T, C)
        else:
            x = mappings.copy_to_parallel(x, self.axis)
        return x @ self.weight.T  # (B, T, V'/t)


class VocabParallelLoss(nn.Module):
    """The cross-entropy of logits split by vocabulary (`vocab_parallel_cross_entropy`), in
    chunks of `minitp.rules.loss_chunk_rows` tokens, as the plain model's loss."""

    def __init__(self, vocab_size: int, d_model: int, axis: Axis):
        super().__init__()
        self.vocab_size, self.d_model, self.axis = vocab_size, d_model, axis

    def forward(self, local_logits, targets):
        rows = loss_chunk_rows(targets.numel(), local_logits.shape[-1], self.d_model)
        return vocab_parallel_cross_entropy(local_logits, targets, self.axis,
                                            vocab_size=self.vocab_size, chunk_rows=rows)


# Each rule: (module of the plain GPT, tp axis, sequence_parallel, the model) -> shard.
def _vocab(m, tp, sp, model):
    return VocabParallelEmbedding.from_dense(m, tp, sequence_parallel=sp)


def _column(m, tp, sp, model):
    return ColumnParallelLinear.from_dense(m, tp, sequence_parallel=sp)


def _row(m, tp, sp, model):
    return RowParallelLinear.from_dense(m, tp, sequence_parallel=sp)


def _dropout(m, tp, sp, model):
    return ShardedDropout.from_dense(m, tp)


def _output(m, tp, sp, model):
    return VocabParallelOutput(model.wte, tp, sp)  # the plan shards wte first


def _loss(m, tp, sp, model):
    return VocabParallelLoss(m.vocab_size, m.d_model, tp)


def _positions(m, tp, sp, model):
    return SequenceShardedPositions(m, tp)


class ParallelInput(nn.Module):
    """The input grouped-query attention's q and kv share, mapped once for both (f, or the
    sequence all-gather): one collective a layer where two projections would each make
    their own, as Megatron-LM's fused qkv does."""

    def __init__(self, axis: Axis, sequence_parallel: bool):
        super().__init__()
        self.axis, self.sequence_parallel = axis, sequence_parallel

    def forward(self, x):
        return mappings.to_column_parallel(x, self.axis, self.sequence_parallel)


def _shared_input(m, tp, sp, model):
    return ParallelInput(tp, sp)


def _q(m, tp, sp, model):
    return ColumnParallelLinear.from_dense(m, tp, sequence_parallel=sp, input_mapped=True)


def _kv(m, tp, sp, model):
    """Grouped-query attention's ``kv``: split by K/V head where tp divides them, else
    replicated (`minitp.rules.heads.kv_layout`); its input mapped by `ParallelInput`."""
    if kv_layout(model.cfg, tp.size) == "split":
        return ColumnParallelLinear.from_dense(m, tp, sequence_parallel=sp, input_mapped=True)
    return ReplicatedKV(m, tp, model.cfg.kv_heads, sequence_parallel=sp, input_mapped=True)


def _overlapped_column(m, tp, sp, model):
    return OverlappedColumnParallelLinear.from_dense(m, tp, sequence_parallel=sp)


def _overlapped_row(m, tp, sp, model):
    return OverlappedRowParallelLinear.from_dense(m, tp, sequence_parallel=sp)


# What each module of the plain GPT becomes on a tensor-parallel rank.
TENSOR_PARALLEL_PLAN = [
    ("wte", _vocab),  # rows split by vocabulary; also the tied output projection's weight
    ("blocks.*.attn.qkv", _column),  # columns = whole heads with their q, k, v
    ("blocks.*.attn.shared_input", _shared_input),  # grouped-query attention: x mapped once
    ("blocks.*.attn.q", _q),  # whole query heads
    ("blocks.*.attn.kv", _kv),  # and whole K/V heads, or each rank its replicated one
    ("blocks.*.attn.q_up", _q),  # latent attention: whole heads' q^C and q^R
    ("blocks.*.attn.kv_up", _q),  # and whole heads' K and V from the replicated latent
    ("blocks.*.attn.core.dropout", _dropout),  # each rank's heads: own masks
    ("blocks.*.attn.proj", _row),
    ("blocks.*.mlp.fc", _column),
    ("blocks.*.mlp.proj", _row),
    ("head", _output),
    ("loss", _loss),
]

# With sequence parallelism the residual stream is split too: its dropouts draw
# independent masks, the positions are this rank's slice, and these parameters'
# gradients are partial on each rank.
SEQUENCE_PARALLEL_PLAN = [
    ("wpe", _positions),
    ("dropout", _dropout),
    ("blocks.*.attn.dropout", _dropout),
    ("blocks.*.mlp.dropout", _dropout),
]
# With tp_overlap (sequence parallelism only), the four GEMMs of a layer whose input
# all-gather or output reduce-scatter can be chunked and overlapped (`overlap.py`)
# take the place of their plain rules above.
TP_OVERLAP_PLAN = {
    "blocks.*.attn.qkv": _overlapped_column,
    "blocks.*.attn.proj": _overlapped_row,
    "blocks.*.mlp.fc": _overlapped_column,
    "blocks.*.mlp.proj": _overlapped_row,
}
# A mixture of experts' shared expert (`minitp.model.moe`) is a dense MLP, split the same way;
# the routed experts are not split over tp (`minitp.expert_parallel`). These rules, and
# the dense MLP's, apply where the model has such modules (a model whose every layer is
# a mixture of experts has no dense MLP).
SHARED_EXPERT_PLAN = [
    ("blocks.*.mlp.shared.fc", _column),
    ("blocks.*.mlp.shared.proj", _row),
]
SHARED_EXPERT_SEQUENCE_PARALLEL_PLAN = [("blocks.*.mlp.shared.dropout", _dropout)]
MLP_PATTERNS = ("blocks.*.mlp.",)

# The attention's input projections: GPT-2's fused qkv, grouped-query attention's q and kv
# reading one mapped input (`GPTConfig.n_kv_head`), or latent attention's up-projections
# (`GPTConfig.mla`) reading it too; a model has one kind.
FUSED_ATTENTION = ("blocks.*.attn.qkv",)
GROUPED_ATTENTION = ("blocks.*.attn.q", "blocks.*.attn.kv")
LATENT_ATTENTION = ("blocks.*.attn.q_up", "blocks.*.attn.kv_up")
SHARED_INPUT = ("blocks.*.attn.shared_input",)


def absent_modules(cfg) -> tuple[str, ...]:
    """The plan patterns a model of `cfg` has no module for: the other kinds of attention
    input, and the learned positions of a model with rotary ones."""
    if cfg.kv_lora_rank:
        absent = FUSED_ATTENTION + GROUPED_ATTENTION
    elif cfg.n_kv_head is not None:
        absent = FUSED_ATTENTION + LATENT_ATTENTION
    else:
        absent = GROUPED_ATTENTION + LATENT_ATTENTION + SHARED_INPUT
    return absent + (() if cfg.positions == "learned" else ("wpe",))


def tag_latent_replicas(model: nn.Module) -> None:
    """Latent attention's replicated modules (`minitp.model.mla.REPLICATED`: the
    down-projections, their norms, the shared rotary key's W^KR) feed only this rank's heads
    (its up-projections' input is not mapped again), so each rank holds one term of their
    gradients: tagged, the step sums them over tp. W^KR is the trap (torchtitan PR #1373's
    review): its k^R reaches every head directly, through no up-projection."""
    for name, p in model.named_parameters():
        if any(matches(name, f"blocks.*.attn.{part}.*") for part in REPLICATED):
            set_tags(p, grad_partial_over_tp=True)


SEQUENCE_PARALLEL_PARTIAL_GRADS = [
    "wpe.*", "ln_f.*", "blocks.*.ln1.*", "blocks.*.ln2.*",
    # the row-parallel biases are tagged by RowParallelLinear itself
]


def apply_tensor_parallel(model: nn.Module, tp: Axis, sequence_parallel: bool,
                          tp_overlap: bool = False) -> None:
    """Shard `model` (a plain GPT, changed in place) over the tensor-parallel axis;
    `tp_overlap`: the layers' GEMMs overlapped with their collectives (needs SP)."""
    check_tp_overlap(tp_overlap, sequence_parallel, tp.size)
    plan = TENSOR_PARALLEL_PLAN
    if tp_overlap:
        plan = [(pattern, TP_OVERLAP_PLAN.get(pattern, make)) for pattern, make in plan]
    plan = plan + SHARED_EXPERT_PLAN + (
        SEQUENCE_PARALLEL_PLAN + SHARED_EXPERT_SEQUENCE_PARALLEL_PLAN if sequence_parallel else [])
    if model.cfg.n_experts:  # the MLP rules only where the layers have such modules
        names = [name for name, _ in model.named_modules()]
        plan = [(pattern, make) for pattern, make in plan
                if not pattern.startswith(MLP_PATTERNS)
                or any(matches(name, pattern) for name in names)]
    else:
        plan = [(pattern, make) for pattern, make in plan if ".mlp.shared." not in pattern]
    absent = absent_modules(model.cfg)
    plan = [(pattern, make) for pattern, make in plan if pattern not in absent]
    apply_plan(model, plan, (tp, sequence_parallel, model))
    if model.cfg.kv_lora_rank:
        tag_latent_replicas(model)
    if sequence_parallel:
        for name, p in model.named_parameters():
            if any(matches(name, pattern) for pattern in SEQUENCE_PARALLEL_PARTIAL_GRADS):
                set_tags(p, grad_partial_over_tp=True)
