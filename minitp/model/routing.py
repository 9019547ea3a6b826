"""Routing for a mixture of experts: which experts each token goes to, with what weight,
which assignments a capacity keeps, and the load-balancing loss. One device's rules;
`minitp.expert_parallel` runs the same rules across ranks.

* The router scores every expert for every token: softmax over the experts (Switch,
  Mixtral) or a sigmoid per expert (DeepSeek-V3). A token's top-k experts are chosen
  from the scores *plus the expert bias* (DeepSeek-V3's auxiliary-loss-free balancing:
  a bias that only steers the choice), and weighted by the scores alone, renormalised
  over the chosen k (the sigmoid router always, the softmax one when k > 1, as Mixtral).
* Capacity (GShard, Switch): with a capacity factor f each expert takes at most
  C = ⌈f · T · k / E⌉ assignments *per sequence* of T tokens. The rule, written once in
  `capacity_keep`: a sequence's assignments queue slot by slot — every token's first
  choice in position order, then every token's second choice — and an assignment is
  kept when fewer than C before it in that queue went to its expert. Deterministic,
  and a function of the whole sequence only, so every mesh can apply it exactly.
* The auxiliary loss (Switch Transformer eq. 4; DeepSeek-V3's sequence-wise form):
  per sequence, E · Σ_e f_e · P_e, with f_e the share of the sequence's k·T
  assignments (before any capacity drop) that chose expert e, and P_e the mean score
  of expert e over its tokens. Its statistics are reduced over **one sequence** —
  the group is the teachable point: a mesh that splits a sequence (sequence or
  context parallelism) must sum them over the ranks holding its parts, never stop at
  its own. The loss of the batch is the mean over its sequences, times the
  coefficient; it enters the gradients through `attach_aux_loss` and is not part of
  the returned language-model loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Routing:
    """One forward's routing of N tokens to k of E experts each."""

    experts: torch.Tensor  # (N, k) int64: the chosen experts, best first
    gates: torch.Tensor    # (N, k): the weights of their outputs (0 where dropped)
    keep: torch.Tensor     # (N, k) bool: False where the capacity dropped the assignment
    scores: torch.Tensor   # (N, E): the router's scores (softmax or sigmoid), for the aux loss


class Router(nn.Module):
    """Scores E experts per token, picks the top k (a linear layer, no bias)."""

    def __init__(self, d_model: int, n_experts: int, top_k: int, kind: str = "softmax"):
        super().__init__()
        self.top_k, self.kind = top_k, kind
        self.gate = nn.Linear(d_model, n_experts, bias=False)
        # Auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): added to the scores only to
        # choose; updated between steps by `update_expert_bias`, never by the optimizer.
        self.register_buffer("expert_bias", torch.zeros(n_experts, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        # The bias stays float32 whatever the model is cast to: its steps of
        # bias_update_rate (1e-3) would round away in bf16 (Megatron-Core keeps it fp32).
        super()._apply(fn, recurse)
        self.expert_bias = self.expert_bias.float()
        return self

    def forward(self, tokens: torch.Tensor):  # (N, C) -> experts, gates (N, k); scores (N, E)
        logits = self.gate(tokens)
        scores = logits.softmax(-1) if self.kind == "softmax" else logits.sigmoid()
        with torch.no_grad():
            experts = (scores + self.expert_bias.to(scores.dtype)).topk(self.top_k, dim=-1).indices
        gates = scores.gather(1, experts)
        if self.kind == "sigmoid" or self.top_k > 1:
            gates = gates / gates.sum(-1, keepdim=True)
        return experts, gates, scores


def capacity(capacity_factor: float, seq_len: int, top_k: int, n_experts: int) -> int:
    """C = ⌈f · T · k / E⌉: the assignments one expert takes from one sequence."""
    return math.ceil(capacity_factor * seq_len * top_k / n_experts)


def capacity_keep(experts: torch.Tensor, n_experts: int, limit: int) -> torch.Tensor:
    """Which of the (B, T, k) assignments the capacity `limit` keeps, per sequence:
    queued slot-major (all first choices in position order, then all second), kept
    while fewer than `limit` earlier ones in the queue went to the same expert."""
    B, T, k = experts.shape
    queue = experts.transpose(1, 2).reshape(B, k * T)  # slot-major, position order inside
    one_hot = F.one_hot(queue, n_experts)  # (B, kT, E)
    before = one_hot.cumsum(1) - one_hot  # earlier assignments to the same expert
    kept = (before * one_hot).sum(-1) < limit  # (B, kT)
    return kept.view(B, k, T).transpose(1, 2)  # (B, T, k)


def sequence_stats(experts: torch.Tensor, scores: torch.Tensor, rows: int, n_experts: int):
    """Per sequence (row) of this rank's tokens: how many assignments chose each expert
    (no gradient) and the sum of each expert's scores (with gradient). (rows, E) each."""
    per_row = experts.view(rows, -1)
    counts = torch.zeros(rows, n_experts, dtype=scores.dtype, device=scores.device)
    counts.scatter_add_(1, per_row, torch.ones_like(per_row, dtype=scores.dtype))
    return counts, scores.view(rows, -1, n_experts).sum(1)


def aux_loss_per_sequence(counts: torch.Tensor, score_sums: torch.Tensor, seq_len: int,
                          top_k: int) -> torch.Tensor:
    """E · Σ_e f_e · P_e for each sequence, from its *whole* sequence's statistics
    (counts and score sums over all T tokens): (rows,). 1 when perfectly balanced."""
    E = counts.shape[-1]
    f = counts / (seq_len * top_k)
    P = score_sums / seq_len
    return E * (f * P).sum(-1)


class _AttachAuxLoss(torch.autograd.Function):
    """Forward: the layer's output unchanged. Backward: also sends `scale` as the aux
    loss's gradient — so the loss reaches the router from inside any pipeline stage,
    without travelling to the last one (Megatron-Core's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, output, aux, scale: float):
        ctx.scale = scale
        ctx.aux_meta = (aux.shape, aux.dtype, aux.device)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad):
        shape, dtype, device = ctx.aux_meta
        return grad, torch.full(shape, ctx.scale, dtype=dtype, device=device), None


def attach_aux_loss(output: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
    return _AttachAuxLoss.apply(output, aux, scale)


@torch.no_grad()
def bias_step(bias: torch.Tensor, load: torch.Tensor, rate: float) -> None:
    """DeepSeek-V3's update: each expert's bias moves by `rate` towards the mean load
    (up if the expert was under-loaded, down if over-loaded; unchanged at the mean)."""
    bias += rate * torch.sign(load.mean() - load).to(bias.dtype)
