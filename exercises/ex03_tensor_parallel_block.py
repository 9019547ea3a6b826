# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex03
# Made from solutions/ex03_tensor_parallel_block.py by `python -m minitp.course.make_exercises`.
"""Exercise 03: a tensor-parallel transformer block, from weight shards and f / g.

`ParallelBlock(block, axis)` below is this rank's shard of a plain
`minitp.model.Block` (pre-LayerNorm: x + attn(ln1(x)), then x + mlp(ln2(x))).
The LayerNorms are replicated: every rank normalises the whole x. You write
the two tensor-parallel halves, Megatron-LM style, from this rank's slices of
the dense weights (``shard`` and ``replicate`` below) and the conjugate mappings
``mt.mappings.copy_to_parallel`` (f: identity forward, all-reduce backward) and
``mt.mappings.reduce_from_parallel`` (g: all-reduce forward, identity backward).
Do not use `mt.ColumnParallelLinear` / `mt.RowParallelLinear` here: this is
what they do inside.

* `ParallelMLP`: fc is column-parallel (this rank's block of the 4h hidden
  features), GELU acts on them locally, proj is row-parallel; its bias is added
  once, after g. One all-reduce forward (g), one backward (f).
* `ParallelAttention`: the qkv projection's output features are ordered
  (head, q/k/v, head_dim), so a contiguous block of its rows is a set of whole
  heads with their q, k and v: a column split is a split by heads. Each rank runs
  attention on its n_head/t heads alone, then the output projection is
  row-parallel, with g and the bias as in the MLP.

``nn.Linear`` keeps ``weight`` as (out_features, in_features): a *column* split
of the maths (the output features) is a split of weight dim 0, and a *row*
split (the input features) of dim 1. Keep the attribute names used below: the
grader reads the gradients from them. Dropout is left out (the grader uses
dropout = 0). Grade with `mt.grade("ex03")` or `python -m minitp.course.grade ex03`.
"""

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import minitp as mt


def shard(param: torch.Tensor, axis: mt.Axis, dim: int) -> nn.Parameter:
    """This rank's chunk of `param` along `dim`, as a new Parameter of its own."""
    return nn.Parameter(param.detach().chunk(axis.size, dim=dim)[axis.rank].clone())


def replicate(param: torch.Tensor) -> nn.Parameter:
    """A whole copy of `param` (the same on every rank), as a new Parameter."""
    return nn.Parameter(param.detach().clone())


def causal_attention(q, k, v):
    """softmax(q kᵀ/√d + causal mask) · v, for each head separately; each (B, nh, T, hs)."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    return F.softmax(scores, dim=-1) @ v  # (B, nh, T, hs)


class ParallelMLP(nn.Module):
    """proj(GELU(fc(x))) with fc split by columns and proj by rows."""

    def __init__(self, mlp, axis: mt.Axis):  # mlp: a minitp.model.MLP
        super().__init__()
        self.axis = axis
        # hint: four Parameters from mlp.fc and mlp.proj: fc_weight, fc_bias (column-parallel:
        # hint: this rank's output features, weight dim 0), proj_weight (row-parallel: its
        # hint: input features, weight dim 1) and proj_bias (whole: replicate it)
        raise NotImplementedError(
            'four Parameters from mlp.fc and mlp.proj: fc_weight, fc_bias (column-parallel: '
            "this rank's output features, weight dim 0), proj_weight (row-parallel: its input"
            ' features, weight dim 1) and proj_bias (whole: replicate it)'
        )

    def forward(self, x):  # (B, T, h), the same on every rank
        # hint: f, then F.linear with fc_weight and fc_bias, GELU, F.linear with proj_weight
        # hint: (no bias), g, and then + proj_bias
        raise NotImplementedError(
            'f, then F.linear with fc_weight and fc_bias, GELU, F.linear with proj_weight (no'
            ' bias), g, and then + proj_bias'
        )


class ParallelAttention(nn.Module):
    """Causal self-attention on this rank's n_head/t heads, proj split by rows."""

    def __init__(self, attn, axis: mt.Axis):  # attn: a minitp.model.CausalSelfAttention
        super().__init__()
        self.axis = axis
        self.head_dim = attn.head_dim
        self.n_head = attn.n_head // axis.size  # the heads on this rank
        # hint: four Parameters from attn.qkv and attn.proj: qkv_weight and qkv_bias
        # hint: (column-parallel: this rank's block of the 3h output features is its heads),
        # hint: proj_weight (row-parallel: weight dim 1) and proj_bias (replicate it)
        raise NotImplementedError(
            'four Parameters from attn.qkv and attn.proj: qkv_weight and qkv_bias (column-'
            "parallel: this rank's block of the 3h output features is its heads), proj_weight"
            ' (row-parallel: weight dim 1) and proj_bias (replicate it)'
        )

    def forward(self, x):  # (B, T, h), the same on every rank
        # hint: f; qkv = F.linear(x, qkv_weight, qkv_bias) is (B, T, 3h/t): view it as
        # hint: (B, T, self.n_head, 3, self.head_dim), the (head, q/k/v, head_dim) layout, and
        # hint: take q, k, v each (B, n_head, T, head_dim); causal_attention; back to
        # hint: (B, T, n_head * head_dim); F.linear with proj_weight; g; + proj_bias
        raise NotImplementedError(
            'f; qkv = F.linear(x, qkv_weight, qkv_bias) is (B, T, 3h/t): view it as (B, T, '
            'self.n_head, 3, self.head_dim), the (head, q/k/v, head_dim) layout, and take q, '
            'k, v each (B, n_head, T, head_dim); causal_attention; back to (B, T, n_head * '
            'head_dim); F.linear with proj_weight; g; + proj_bias'
        )


class ParallelBlock(nn.Module):
    """This rank's shard of a `minitp.model.Block`: replicated LayerNorms, parallel halves."""

    def __init__(self, block, axis: mt.Axis):
        super().__init__()
        self.ln1 = copy.deepcopy(block.ln1)  # replicated: every rank normalises the whole x
        self.attn = ParallelAttention(block.attn, axis)
        self.ln2 = copy.deepcopy(block.ln2)
        self.mlp = ParallelMLP(block.mlp, axis)

    def forward(self, x):  # (B, T, h), the same on every rank
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
