"""Grouped-query attention's K/V projection when tp is above the K/V heads.

With n_kv_head K/V heads and tp ranks, tp dividing n_kv_head splits the K/V heads
like the query heads (`ColumnParallelLinear` on ``kv``: its features are ordered by
K/V head). When tp is *above* them (Llama 3 70B: 8 K/V heads, tp 16 would be such a
case; multi-query attention, one K/V head, at any tp > 1), a K/V head must serve the
query heads of tp/n_kv_head ranks, so it is replicated: `ReplicatedKV`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runtime.mesh import Axis
from ..sharding.tags import set_tags
from . import mappings


class ReplicatedKV(nn.Module):
    """The K/V projection of a rank whose query heads read one K/V head that other
    ranks read too. Every rank holds the whole projection (replicated: it is n_kv_head
    heads, fewer than tp) and computes only its own head's K and V.

    Each rank's weight gradient is then its query heads' share of its head's gradient,
    and zero for the other heads; the whole gradient is the sum over tp. The weight is
    tagged ``grad_partial_over_tp``, so the step sums it as it sums sequence
    parallelism's partial gradients (`minitp.tensor_parallel.partial_grads`). Left out,
    each copy would learn from a fraction of its gradient and the copies drift apart.
    The input reaches it through f (or the sequence all-gather), like a column-parallel
    layer's: the input gradient of its one head is partial too, and f sums it."""

    def __init__(self, dense: nn.Linear, axis: Axis, kv_heads: int,
                 sequence_parallel: bool = False, input_mapped: bool = False):
        super().__init__()
        self.axis, self.sequence_parallel, self.input_mapped = axis, sequence_parallel, input_mapped
        self.kv_heads, self.head = kv_heads, axis.rank * kv_heads // axis.size
        self.weight = nn.Parameter(dense.weight.detach().clone())
        self.bias = (nn.Parameter(dense.bias.detach().clone()) if dense.bias is not None
                     else None)
        rows = self.weight.shape[0] // kv_heads  # one head's K and V: 2·head_dim features
        self.rows = slice(self.head * rows, (self.head + 1) * rows)
        for p in (self.weight, self.bias):
            if p is not None:
                set_tags(p, grad_partial_over_tp=True)

    def forward(self, x) -> torch.Tensor:  # (B, T or T/t, C) -> (B, T, 2·hs)
        if not self.input_mapped:  # (`ParallelInput` did it for q and kv together)
            x = mappings.to_column_parallel(x, self.axis, self.sequence_parallel)
        bias = self.bias[self.rows] if self.bias is not None else None
        return F.linear(x, self.weight[self.rows], bias)

    def extra_repr(self) -> str:
        return (f"K/V head {self.head} of {self.kv_heads} (the whole projection replicated "
                f"over {self.axis.name}={self.axis.size}), "
                f"sequence_parallel={self.sequence_parallel}")
