"""Tensor-parallel layers: Megatron-LM's column- and row-parallel linear layers and
its vocab-parallel embedding, each built from the conjugate mappings.

Each layer holds only its own shard of the weights, and `.from_dense(module,
axis)` takes that shard from an existing single-device layer, so the parallel
layer and the dense one compute the same function. Built directly under one
seed, the ranks' shards are slices of one dense initialisation, N(0, 0.02²)
weights and zero biases, as if the dense layer had been built and then split.
Each parameter declares how it is split with `minitp.sharding.tags`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..rules import check_token_ids, round_up
from ..runtime.mesh import Axis
from ..sharding.tags import set_tags
from . import mappings, weight_grad

INIT_STD = 0.02  # GPT-2's and Megatron-LM's init_method_normal(0.02), as GPT._init_weights


def _shard_size(total: int, axis: Axis, what: str) -> int:
    if total % axis.size:
        raise ValueError(f"{what}={total} is not divisible by the {axis.name} size {axis.size}")
    return total // axis.size


def _dense_init(rows: int, columns: int, dtype, device) -> torch.Tensor:
    """The dense weight W ~ N(0, INIT_STD²) that the single-device layer would start from.

    Each rank draws the *whole* matrix and keeps its slice (Megatron-LM's
    `_initialize_affine_weight_cpu`): the ranks' shards are then slices of one
    dense initialisation, and the default generator advances alike on every rank,
    so it stays replicated (plain dropout on the replicated stream relies on that).
    Drawing only the local shard would give every rank the *same* numbers.
    """
    return nn.init.normal_(torch.empty(rows, columns, dtype=dtype, device=device), std=INIT_STD)


class ColumnParallelLinear(nn.Module):
    """Y = XA + b with A split by columns: A = [A_1, …, A_p], b = [b_1, …, b_p].

    Rank i computes Y_i = X A_i + b_i, its slice of the output features; no
    communication is needed in the forward pass because every rank has all of X.
    X reaches it through f (identity forward, all-reduce of the input gradient
    backward) — or, with sequence parallelism, through an all-gather of the
    sequence shards (reduce-scatter backward). ``gather_output=True`` all-gathers
    the Y_i so every rank holds the full Y.
    """

    def __init__(self, d_in: int, d_out: int, axis: Axis, gather_output: bool = False,
                 sequence_parallel: bool = False, bias: bool = True, dtype=None, device=None,
                 input_mapped: bool = False):
        super().__init__()
        self.axis, self.sequence_parallel = axis, sequence_parallel
        self.input_mapped = input_mapped  # x already went through f (`ParallelInput`)
        self.gather_output = gather_output
        self.d_in, self.d_out = d_in, d_out
        local = _shard_size(d_out, axis, "d_out")
        dense = _dense_init(d_out, d_in, dtype, device)  # (d_out, d_in); keep rows A_i
        self.weight = nn.Parameter(dense.narrow(0, axis.rank * local, local).clone())
        self.bias = nn.Parameter(torch.zeros(local, dtype=dtype, device=device)) if bias else None
        # Tags read by ParallelGPT.full_state_dict (and checkpoints) to put shards back together.
        set_tags(self.weight, tp_split_dim=0)
        if self.bias is not None:
            set_tags(self.bias, tp_split_dim=0)
        self.weight_grads = None  # a B/W-split pipeline's store while its B runs (weight_grad)
        self.fp8 = None  # FP8's scales (`minitp.fp8.LayerScales`), set by `minitp.fp8.apply`

    def forward(self, x):
        if self.fp8 is not None:  # cast before the mapping: under SP, the sequence shard
            x = self.fp8.cast_input(x)
        if not self.input_mapped:
            x = mappings.to_column_parallel(x, self.axis, self.sequence_parallel)
        y = weight_grad.linear(x, self.weight, self.bias, self)  # (B, T, d_out/t)
        return mappings.gather_from_parallel(y, self.axis) if self.gather_output else y

    @classmethod
    def from_dense(cls, module: nn.Linear, axis: Axis, **kw) -> ColumnParallelLinear:
        """This rank's column block of a dense ``nn.Linear`` (weights copied, not shared)."""
        layer = cls(module.in_features, module.out_features, axis, bias=module.bias is not None,
                    dtype=module.weight.dtype, device=module.weight.device, **kw)
        with torch.no_grad():
            layer.weight.copy_(module.weight.chunk(axis.size, dim=0)[axis.rank])
            if module.bias is not None:
                layer.bias.copy_(module.bias.chunk(axis.size)[axis.rank])
        return layer

    def extra_repr(self) -> str:
        return (f"d_in={self.d_in}, d_out={self.d_out} (this rank: {self.weight.shape[0]}), "
                f"{self.axis.name}={self.axis.size}, gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """Y = XA + b with A split by rows: A = [A_1; …; A_p], X = [X_1, …, X_p].

    Rank i holds X_i (its slice of the input features, typically the output of a
    column-parallel layer) and computes the partial product X_i A_i. Y is their
    sum, so g all-reduces them (identity backward) — or, with sequence
    parallelism, reduce-scatters them along the sequence (all-gather backward).
    The bias is added once, after the reduction: added before, it would be
    counted p times.
    """

    def __init__(self, d_in: int, d_out: int, axis: Axis, sequence_parallel: bool = False,
                 bias: bool = True, dtype=None, device=None):
        super().__init__()
        self.axis, self.sequence_parallel = axis, sequence_parallel
        self.d_in, self.d_out = d_in, d_out
        local = _shard_size(d_in, axis, "d_in")
        dense = _dense_init(d_out, d_in, dtype, device)  # (d_out, d_in); keep columns A_i
        self.weight = nn.Parameter(dense.narrow(1, axis.rank * local, local).clone())
        self.bias = nn.Parameter(torch.zeros(d_out, dtype=dtype, device=device)) if bias else None
        set_tags(self.weight, tp_split_dim=1)
        self.weight_grads = None  # a B/W-split pipeline's store while its B runs (weight_grad)
        self.fp8 = None  # FP8's scales (`minitp.fp8.LayerScales`), set by `minitp.fp8.apply`
        if self.bias is not None and sequence_parallel:
            # Each rank adds it to its own sequence shard, so each rank's gradient is
            # partial: the training step must sum it over the axis (as LayerNorm's).
            set_tags(self.bias, grad_partial_over_tp=True)

    def forward(self, x):  # (B, T, d_in/t)
        if self.fp8 is not None:
            x = self.fp8.cast_input(x)
        if self.axis.size == 1:  # the one term is the sum: the bias fused into the GEMM (addmm)
            return weight_grad.linear(x, self.weight, self.bias, self)
        partial = weight_grad.linear(x, self.weight, None, self)  # (B, T, d_out): one term
        if self.sequence_parallel:
            y = mappings.reduce_scatter_to_sequence(partial, self.axis)  # (B, T/t, d_out)
        else:
            y = mappings.reduce_from_parallel(partial, self.axis)
        return y + self.bias if self.bias is not None else y

    @classmethod
    def from_dense(cls, module: nn.Linear, axis: Axis, **kw) -> RowParallelLinear:
        """This rank's row block of a dense ``nn.Linear`` (the bias whole)."""
        layer = cls(module.in_features, module.out_features, axis, bias=module.bias is not None,
                    dtype=module.weight.dtype, device=module.weight.device, **kw)
        with torch.no_grad():
            layer.weight.copy_(module.weight.chunk(axis.size, dim=1)[axis.rank])
            if module.bias is not None:
                layer.bias.copy_(module.bias)
        return layer

    def extra_repr(self) -> str:
        return (f"d_in={self.d_in} (this rank: {self.weight.shape[1]}), d_out={self.d_out}, "
                f"{self.axis.name}={self.axis.size}, sequence_parallel={self.sequence_parallel}")


class VocabParallelEmbedding(nn.Module):
    """E[ids] with the table E split by rows (vocabulary ranges) across ranks.

    The vocabulary is padded up to a multiple of the axis size; rank i owns ids
    [i·V'/p, (i+1)·V'/p). It looks up the ids in its range, writes zeros for the
    others, and g sums the ranks' results — exactly one rank contributed each
    row. With ``sequence_parallel`` the sum is a reduce-scatter along the
    sequence instead, so each rank receives only its shard. Padded rows are
    never looked up (an id outside [0, vocab_size) is refused), so they never
    get a gradient here;
    ``padded_logits_mask`` lets the tied output layer keep them out of the loss.
    """

    def __init__(self, vocab_size: int, d_model: int, axis: Axis, sequence_parallel: bool = False,
                 dtype=None, device=None):
        super().__init__()
        self.axis, self.vocab_size, self.d_model = axis, vocab_size, d_model
        self.sequence_parallel = sequence_parallel
        self.padded_vocab = round_up(vocab_size, axis.size)
        local = self.padded_vocab // axis.size
        self.vocab_start = axis.rank * local
        self.vocab_end = self.vocab_start + local
        dense = _dense_init(vocab_size, d_model, dtype, device)  # the real rows only
        self.weight = nn.Parameter(torch.zeros(local, d_model, dtype=dtype, device=device))
        with torch.no_grad():  # padding rows stay zero
            self.weight[: self.real_rows].copy_(dense[self.vocab_start:][: self.real_rows])
        set_tags(self.weight, tp_split_dim=0, tp_true_size=vocab_size)

    @property
    def real_rows(self) -> int:
        """How many of this rank's rows are real vocabulary (the rest is padding)."""
        return max(0, min(self.vocab_end, self.vocab_size) - self.vocab_start)

    def forward(self, ids):  # (B, T) int64
        # Every rank holds the same ids, so every rank refuses a bad one alike. Unchecked,
        # a padding id would read a zero row and one past it no row at all: silently zero.
        check_token_ids(ids, self.vocab_size, "input id")
        if self.axis.size == 1:  # the whole vocabulary: nothing outside, nothing to sum
            return F.embedding(ids, self.weight)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local_ids = (ids - self.vocab_start).masked_fill(outside, 0)
        rows = F.embedding(local_ids, self.weight)  # (B, T, C)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)  # this rank's term of the sum
        if self.sequence_parallel:  # sum and hand each rank its sequence shard at once
            return mappings.reduce_scatter_to_sequence(rows, self.axis)  # (B, T/t, C)
        return mappings.reduce_from_parallel(rows, self.axis)

    def padded_logits_mask(self) -> torch.Tensor:
        """True for this rank's logit columns that are padding, not vocabulary."""
        columns = torch.arange(self.vocab_start, self.vocab_end, device=self.weight.device)
        return columns >= self.vocab_size

    @classmethod
    def from_dense(cls, module: nn.Embedding, axis: Axis, **kw) -> VocabParallelEmbedding:
        """This rank's vocabulary rows of a dense ``nn.Embedding`` (padding rows zero)."""
        layer = cls(module.num_embeddings, module.embedding_dim, axis,
                    dtype=module.weight.dtype, device=module.weight.device, **kw)
        with torch.no_grad():
            layer.weight.zero_()
            layer.weight[: layer.real_rows].copy_(
                module.weight[layer.vocab_start: layer.vocab_start + layer.real_rows]
            )
        return layer

    def extra_repr(self) -> str:
        return (f"vocab={self.vocab_size} (padded {self.padded_vocab}; this rank: ids "
                f"{self.vocab_start}..{self.vocab_end - 1}), d_model={self.d_model}")
