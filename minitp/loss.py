"""Cross-entropy over logits split by vocabulary, without ever gathering them.

Rank i holds logits z[:, V_i] for its vocabulary range V_i. For one token with
target t, the loss is log Σ_v exp(z_v) − z_t. Three all-reduces of one number
per token give everything the ranks need:

1. max:  m = max_v z_v (so exp never overflows);
2. sum:  z_t − m (only the rank that owns t contributes; the others add 0);
3. sum:  S = Σ_v exp(z_v − m) (each rank sums over its own columns).

loss = log S − (z_t − m). The backward needs no communication at all: the
gradient for column v is softmax_v − [v = t], and each rank has both for its
own columns. Padded vocabulary columns (≥ vocab_size) take no part.
"""

from __future__ import annotations

import torch

from . import comm, trace
from .mesh import Axis


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, targets, axis, ignore_index, vocab_size):
        width = local_logits.shape[-1]
        start = axis.rank * width  # every rank holds an equal share of the (padded) vocabulary
        logits = local_logits.reshape(-1, width)  # (N, V/t)
        targets = targets.reshape(-1)  # (N,)
        if vocab_size is not None and vocab_size < start + width:
            padded = torch.arange(start, start + width, device=logits.device) >= vocab_size
            logits = logits.masked_fill(padded, float("-inf"))
        global_max = comm.all_reduce(logits.max(dim=-1).values, axis, op="max")  # (N,)
        shifted = logits - global_max.unsqueeze(-1)  # (N, V/t), every entry <= 0

        ignored = targets == ignore_index
        mine = (targets >= start) & (targets < start + width) & ~ignored
        local_target = (targets - start).clamp(0, width - 1)
        target_logit = shifted.gather(1, local_target.unsqueeze(1)).squeeze(1)
        target_logit = comm.all_reduce(torch.where(mine, target_logit, 0.0), axis)  # (N,)

        exp = shifted.exp()
        sum_exp = comm.all_reduce(exp.sum(dim=-1), axis)  # (N,)

        per_token = torch.where(ignored, 0.0, sum_exp.log() - target_logit)
        count = (~ignored).sum()
        ctx.save_for_backward(exp, sum_exp, local_target, mine, ignored, count)
        ctx.shape = local_logits.shape
        return per_token.sum() / count

    @staticmethod
    def backward(ctx, grad):
        exp, sum_exp, local_target, mine, ignored, count = ctx.saved_tensors
        grad_logits = exp / sum_exp.unsqueeze(-1)  # softmax over the whole vocabulary
        rows = torch.arange(grad_logits.shape[0], device=grad_logits.device)
        grad_logits[rows[mine], local_target[mine]] -= 1.0
        grad_logits[ignored] = 0.0
        grad_logits *= grad / count
        return grad_logits.view(ctx.shape), None, None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, axis: Axis,
                                 ignore_index: int = -100, vocab_size: int | None = None):
    """Mean cross-entropy of targets under logits split by vocabulary across `axis`.

    local_logits: (..., V'/t), this rank's columns of a vocabulary padded to V'
    (a multiple of t); targets: (...) int64 ids; vocab_size: the real V, so that
    padded columns are left out (None: no padding). Equal to
    ``F.cross_entropy(gathered_logits[..., :V], targets, ignore_index=…)``.
    """
    if local_logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(local_logits.shape)} and targets {tuple(targets.shape)} disagree: "
            "targets must have the logits' shape without the last (vocabulary) dimension"
        )
    with trace.forward_phase():
        return _VocabParallelCrossEntropy.apply(
            local_logits, targets, axis, ignore_index, vocab_size
        )
