"""Cross-entropy over logits split by vocabulary, without ever gathering them.

Rank i holds logits z[:, V_i] for its vocabulary range V_i. For one token with
target t, the loss is log Σ_v exp(z_v) − z_t. Three all-reduces of one number
per token give everything the ranks need:

1. max:  m = max_v z_v (so exp never overflows);
2. sum:  z_t − m (only the rank that owns t contributes; the others add 0);
3. sum:  S = Σ_v exp(z_v − m) (each rank sums over its own columns).

loss = log S − (z_t − m). The backward needs no communication at all: the
gradient for column v is softmax_v − [v = t], and each rank has both for its
own columns. Padded vocabulary columns (≥ vocab_size) take no part. Each pass over
the logits runs chunk by chunk over tokens, as the plain loss does
(`minitp.model.cross_entropy`): the same idea along the other axis.

The bookkeeping assumes what it cannot see, so it is checked first: every rank
holds the same number of columns, ceil(V/t), and every target is a real id in
[0, V) or the ignore index. A target among the padded columns would otherwise
score against a −∞ logit (an infinite loss), and one past them would be owned
by no rank (a finite, silently wrong loss).
"""

from __future__ import annotations

import torch

from ..model.cross_entropy import (
    accumulation_dtype,
    chunked_cross_entropy,
    chunks,
    softmax_minus_one_hot,
)
from ..rules import IGNORE_INDEX, ceil_div, check_token_ids
from ..runtime import comm, trace
from ..runtime.mesh import Axis


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Chunk by chunk over tokens, as `minitp.model.cross_entropy`: no whole-size float32
    tensor, forward or backward. What is kept for backward is this rank's logits (in their
    own dtype) and one number per token, the log-sum-exp over the whole vocabulary."""

    @staticmethod
    def forward(ctx, logits, targets, axis, ignore_index, vocab_size, rows):  # (N, V/t), (N,)
        width, acc = logits.shape[-1], accumulation_dtype(logits.dtype)
        start = axis.rank * width  # every rank holds an equal share of the (padded) vocabulary
        # this rank's real columns; the rest are padding and take no part (a slice, not a mask)
        real = width if vocab_size is None else max(0, min(width, vocab_size - start))
        spans = chunks(logits.shape[0], rows)

        local_max = torch.full(logits.shape[:1], float("-inf"), dtype=acc, device=logits.device)
        if real:
            for s, e in spans:
                local_max[s:e] = logits[s:e, :real].amax(dim=-1)
        global_max = comm.all_reduce(local_max, axis, op="max")  # 1. (N,)

        ignored = targets == ignore_index
        mine = (targets >= start) & (targets < start + real) & ~ignored
        local_target = (targets - start).clamp(0, max(real, 1) - 1)
        target_logit = logits.gather(1, local_target.unsqueeze(1)).squeeze(1).to(acc)
        target_logit = comm.all_reduce(  # 2. z_t − m, from the rank that owns t
            torch.where(mine, target_logit - global_max, 0.0), axis)

        sum_exp = torch.zeros_like(local_max)
        if real:
            for s, e in spans:
                shifted = torch.sub(logits[s:e, :real].to(acc), global_max[s:e].unsqueeze(1))
                sum_exp[s:e] = shifted.exp_().sum(dim=-1)
        sum_exp = comm.all_reduce(sum_exp, axis)  # 3. (N,)

        per_token = torch.where(ignored, 0.0, sum_exp.log() - target_logit)
        count = (~ignored).sum()
        ctx.save_for_backward(logits, global_max + sum_exp.log(), local_target, mine, ignored,
                              count)
        ctx.rows, ctx.real = rows, real
        return per_token.sum() / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        logits, lse, local_target, mine, ignored, count = ctx.saved_tensors
        acc, real = lse.dtype, ctx.real
        # With every target ignored the loss is 0/0 = NaN (as F.cross_entropy's), but the
        # gradient is zero: every row's factor is 0.
        scale = (~ignored).to(acc) * (grad.to(acc) / count.clamp(min=1))
        grad_logits = torch.zeros_like(logits)  # padding columns: no gradient
        if real:
            hit = mine.to(acc)
            for s, e in chunks(logits.shape[0], ctx.rows):
                grad_logits[s:e, :real] = softmax_minus_one_hot(
                    logits[s:e, :real], lse[s:e], local_target[s:e], scale[s:e], acc, hit[s:e])
        return grad_logits, None, None, None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, axis: Axis,
                                 ignore_index: int = IGNORE_INDEX, vocab_size: int | None = None,
                                 chunk_rows: int | None = None):
    """Mean cross-entropy of targets under logits split by vocabulary across `axis`.

    local_logits: (..., V'/t), this rank's columns of a vocabulary padded to V'
    (a multiple of t); targets: (...) int64 ids in [0, V) or `ignore_index`;
    vocab_size: the real V, so that padded columns are left out (None: no
    padding, V = V'); chunk_rows: tokens per chunk (None: all at once;
    `minitp.rules.loss_chunk_rows` is the model's rule). Equal to
    ``F.cross_entropy(gathered_logits[..., :V], targets, ignore_index=…)``.
    On an axis of one rank with nothing padded, it is the plain chunked loss
    (`minitp.model.cross_entropy`): no collective, no mask.
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
    if axis.size == 1 and true_vocab == width:
        return chunked_cross_entropy(local_logits, targets, ignore_index, chunk_rows)
    with trace.forward_phase():
        return _VocabParallelCrossEntropy.apply(
            local_logits.reshape(-1, width), targets.reshape(-1), axis, ignore_index,
            vocab_size, chunk_rows)


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
