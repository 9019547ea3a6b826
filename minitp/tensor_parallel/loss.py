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

The bookkeeping assumes what it cannot see, so it is checked first: every rank
holds the same number of columns, ceil(V/t), and every target is a real id in
[0, V) or the ignore index. A target among the padded columns would otherwise
score against a −∞ logit (an infinite loss), and one past them would be owned
by no rank (a finite, silently wrong loss).
"""

from __future__ import annotations

import torch

from ..mixed_precision import loss_precision
from ..rules import IGNORE_INDEX, ceil_div, check_token_ids
from ..runtime import comm, trace
from ..runtime.mesh import Axis


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
        # With every target ignored the loss is 0/0 = NaN (as F.cross_entropy's), but
        # the gradient is zero, not 0·(1/0): every row was zeroed just above.
        grad_logits *= grad / count.clamp(min=1)
        return grad_logits.view(ctx.shape), None, None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, axis: Axis,
                                 ignore_index: int = IGNORE_INDEX, vocab_size: int | None = None):
    """Mean cross-entropy of targets under logits split by vocabulary across `axis`.

    local_logits: (..., V'/t), this rank's columns of a vocabulary padded to V'
    (a multiple of t); targets: (...) int64 ids in [0, V) or `ignore_index`;
    vocab_size: the real V, so that padded columns are left out (None: no
    padding, V = V'). Equal to
    ``F.cross_entropy(gathered_logits[..., :V], targets, ignore_index=…)``.
    """
    if local_logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(local_logits.shape)} and targets {tuple(targets.shape)} disagree: "
            "targets must have the logits' shape without the last (vocabulary) dimension"
        )
    width = local_logits.shape[-1]
    _check_width(width, axis, vocab_size, local_logits.device)
    true_vocab = width * axis.size if vocab_size is None else vocab_size
    # Every rank holds the same targets, so every rank raises here alike, before any
    # collective: none is left waiting for a rank that gave up.
    check_token_ids(targets, true_vocab, "target id", ignore_index=ignore_index)
    with trace.forward_phase():
        return _VocabParallelCrossEntropy.apply(
            loss_precision(local_logits), targets, axis, ignore_index, vocab_size
        )


def _check_width(width: int, axis: Axis, vocab_size: int | None, device) -> None:
    """Every rank must hold the same ceil(V/t) columns: rank i's columns start at i·width,
    so one rank narrower than the rest would shift every id after it."""
    if vocab_size is not None:
        # The rule is known here, so no communication is needed; a wrong rank raises alone
        # (and the launcher stops the others, which wait in the first all-reduce).
        expected = ceil_div(vocab_size, axis.size)
        if width != expected:
            raise ValueError(
                f"logits are {width} wide on rank {axis.rank} of {axis.name}, but a vocabulary "
                f"of {vocab_size} split over {axis.size} ranks needs ceil({vocab_size}/"
                f"{axis.size}) = {expected} columns on every rank "
                f"(padded to {expected * axis.size})"
            )
        return
    # Without V, only the ranks together know: one all-reduce of (width, −width) gives
    # the largest and smallest width to every rank, so all of them raise alike. It is
    # bookkeeping, not the loss's communication: paused, the trace does not count it.
    with trace.paused():
        extremes = comm.all_reduce(torch.tensor([width, -width], device=device), axis, op="max")
    widest, narrowest = int(extremes[0]), -int(extremes[1])
    if widest != narrowest:
        raise ValueError(
            f"logits of unequal widths over {axis.name}: between {narrowest} and {widest} "
            "columns; every rank must hold an equal share of the (padded) vocabulary"
        )
