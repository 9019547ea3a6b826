"""A mixture-of-experts layer on one device: the reference expert parallelism must equal.

It takes the place of a block's MLP (`GPTConfig.n_experts > 0`). Each token is sent to
k of E expert MLPs by a router (`minitp.model.routing`: top-k, capacity, balancing) and its
output is the gate-weighted sum of theirs, plus a shared expert's where there is one
(DeepSeek-V3). No distributed code lives here. Like attention's core, the two places
where a mesh changes what happens are their own modules, so `minitp.expert_parallel`
replaces them and nothing else:

* ``dispatch`` (`LocalDispatch`): the kept assignments permuted so each expert's tokens
  are contiguous, the experts run, and the results un-permuted and weighted by their
  gates. Expert parallelism adds the all-to-all that carries the permuted tokens to the
  ranks holding their experts and back;
* ``sequence`` (`WholeSequence`): where a sequence's routing statistics and capacity
  queue are complete. Here every sequence is whole; on a mesh that splits sequences
  they are summed or gathered over the ranks holding the parts.

The experts' weights are stacked, (E, …) per tensor, so a rank's share of the experts
is a slice of dim 0, and an expert's tokens meet its weights in one matmul.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .expert_mlps import expert_mlps
from .routing import (
    Router,
    attach_aux_loss,
    aux_loss_per_sequence,
    bias_step,
    capacity,
    capacity_keep,
    sequence_stats,
)


class Experts(nn.Module):
    """E GELU MLPs (d → 4d → d), their weights stacked along dim 0. A rank under expert
    parallelism holds a run of them: experts ``first .. first + count − 1``."""

    def __init__(self, n_experts: int, d_model: int, bias: bool, first: int = 0):
        super().__init__()
        # how many experts this module holds (read once: ZeRO-3 empties the parameters)
        self.first, self.count, hidden = first, n_experts, 4 * d_model
        self.fc_weight = nn.Parameter(torch.randn(n_experts, d_model, hidden) * 0.02)
        self.proj_weight = nn.Parameter(torch.randn(n_experts, hidden, d_model) * 0.02)
        self.fc_bias = nn.Parameter(torch.zeros(n_experts, hidden)) if bias else None
        self.proj_bias = nn.Parameter(torch.zeros(n_experts, d_model)) if bias else None

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x (A, C): rows grouped by expert, ``counts[e]`` rows for this module's e-th
        (one autograd Function: `minitp.model.expert_mlps`)."""
        return expert_mlps(x, counts, self.fc_weight, self.fc_bias, self.proj_weight,
                           self.proj_bias)


def permute(tokens: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor, n_experts: int):
    """The kept assignments' token rows sorted by expert (stable: token order within an
    expert), with what `unpermute` needs. Returns (rows (A, C), counts per expert (E,),
    order, token_of): row i is token ``token_of[order[i]]``."""
    N, k = experts.shape
    token_of = torch.arange(N, device=tokens.device).unsqueeze(1).expand(N, k)[keep]
    expert_of = experts[keep]
    order = torch.argsort(expert_of, stable=True)
    counts = torch.bincount(expert_of, minlength=n_experts)
    return tokens[token_of[order]], counts, order, token_of


def unpermute(rows: torch.Tensor, order: torch.Tensor, token_of: torch.Tensor,
              gates: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """The inverse of `permute`, each row weighted by its gate and summed into its
    token: (N, C), zero for a token whose every assignment was dropped. `gates` are in
    assignment order, like `token_of`; row i, sorted, is assignment ``order[i]``, so it is
    added straight into token ``token_of[order[i]]`` (no need to undo the sort first)."""
    weighted = rows * gates[order].unsqueeze(1)
    out = rows.new_zeros(n_tokens, rows.shape[1])
    return out.index_add(0, token_of[order], weighted)


class LocalDispatch(nn.Module):
    """Every expert is here: permute, run, un-permute. (`minitp.expert_parallel`'s
    all-to-all dispatch overrides `run_experts` and nothing else.)"""

    def forward(self, tokens, experts, gates, keep, expert_module: Experts, n_experts: int):
        rows, counts, order, token_of = permute(tokens, experts, keep, n_experts)
        out_rows = self.run_experts(rows, counts, expert_module)
        return unpermute(out_rows, order, token_of, gates[keep], tokens.shape[0])

    def run_experts(self, rows, counts, expert_module: Experts):
        return expert_module(rows, counts.tolist())


class WholeSequence(nn.Module):
    """On one device every row is a whole sequence: its statistics are complete."""

    def sum(self, per_sequence: torch.Tensor) -> torch.Tensor:
        return per_sequence

    def whole(self, experts: torch.Tensor):
        """(B, T, k) choices of every position of each sequence, and where this rank's
        positions are in it."""
        return experts, slice(None)

    def seq_len(self, local: int) -> int:
        return local

    def mine(self, x: torch.Tensor) -> torch.Tensor:
        """The positions of x (B, T, C) this rank routes to the experts: all of them."""
        return x

    def restore(self, out: torch.Tensor) -> torch.Tensor:
        """The routed output back at x's positions (the inverse of `mine`)."""
        return out

    def total(self, load: torch.Tensor) -> torch.Tensor:
        """The step's load over every rank's tokens: here, all of them."""
        return load


class MoE(nn.Module):
    """Router, experts, optional shared expert: the MLP of a mixture-of-experts block.

    After a training forward it also holds what the lesson draws: ``load`` (E,), the
    assignments each expert got this step (before capacity drops; `update_expert_bias`
    reads and clears it), ``dropped``, and ``last_aux``, the last auxiliary loss.
    ``aux_rows``: the number of sequences the aux loss is averaged over — None, this
    forward's rows (one device); `mt.train_step` sets the global batch's.
    """

    def __init__(self, cfg, shared: nn.Module | None = None):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.capacity_factor, self.balance = cfg.capacity_factor, cfg.balance
        self.aux_coef, self.bias_rate = cfg.aux_loss_coef, cfg.bias_update_rate
        self.router = Router(cfg.d_model, cfg.n_experts, cfg.top_k, cfg.router)
        self.experts = Experts(cfg.n_experts, cfg.d_model, cfg.bias)
        self.dispatch = LocalDispatch()
        self.sequence = WholeSequence()
        self.shared = shared
        self.register_buffer("load", torch.zeros(cfg.n_experts, dtype=torch.float64),
                             persistent=False)
        self.dropped, self.last_aux, self.aux_rows = 0, None, None

    def _apply(self, fn, recurse=True):
        # The load counts tokens: kept float64 whatever the model is cast to (in bf16 a count
        # above 256 would round, and the expert bias steps by comparing counts).
        super()._apply(fn, recurse)
        self.load = self.load.double()
        return self

    def forward(self, x):  # (B, T, C): T this rank's positions of each sequence
        routed = self.sequence.mine(x)  # the positions this rank routes (here: all)
        B, T, C = routed.shape
        tokens = routed.reshape(B * T, C)
        experts, gates, scores = self.router(tokens)
        keep = self._keep(experts.view(B, T, self.top_k)).reshape(-1, self.top_k)
        out = self.dispatch(tokens, experts, gates * keep, keep, self.experts, self.n_experts)
        if self.training:
            with torch.no_grad():
                self.load += torch.bincount(experts.flatten(), minlength=self.n_experts)
                self.dropped += int((~keep).sum())
        if self.balance == "aux" and torch.is_grad_enabled():
            out = self._with_aux_loss(out, experts, scores, B, T)
        out = self.sequence.restore(out.view(B, T, C))
        return out if self.shared is None else out + self.shared(x)

    def _keep(self, experts: torch.Tensor) -> torch.Tensor:
        if self.capacity_factor is None:  # dropless
            return torch.ones_like(experts, dtype=torch.bool)
        whole, mine = self.sequence.whole(experts)
        limit = capacity(self.capacity_factor, whole.shape[1], self.top_k, self.n_experts)
        return capacity_keep(whole, self.n_experts, limit)[:, mine]

    def _with_aux_loss(self, out, experts, scores, rows: int, local: int):
        counts, score_sums = sequence_stats(experts, scores, rows, self.n_experts)
        counts, score_sums = self.sequence.sum(counts), self.sequence.sum(score_sums)
        aux = aux_loss_per_sequence(counts, score_sums, self.sequence.seq_len(local), self.top_k)
        self.last_aux = float(aux.detach().mean())
        return attach_aux_loss(out, aux.sum(), self.aux_coef / (self.aux_rows or rows))


def moe_layers(model: nn.Module) -> list[MoE]:
    """Every MoE layer of `model` (a plain GPT, a shard, or a pipelined model)."""
    return [m for m in model.modules() if isinstance(m, MoE)]


@torch.no_grad()
def update_expert_bias(model: nn.Module) -> None:
    """After an optimizer step: every MoE layer balanced by the expert bias moves it by
    the step's load — summed over every rank's tokens by its ``sequence`` module — and
    every layer's ``load`` is cleared."""
    for layer in moe_layers(model):
        if layer.balance == "bias":
            bias_step(layer.router.expert_bias, layer.sequence.total(layer.load),
                      layer.bias_rate)
        layer.load.zero_()
        layer.dropped = 0
