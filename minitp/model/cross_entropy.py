"""The next-token loss, computed chunk by chunk over tokens: it never holds a float32 copy of
the whole logits, and never a whole-size softmax.

For one token with target t, loss = log Σ_v exp(z_v) − z_t. `F.cross_entropy` on 16-bit
logits first widens all of them to float32 (tokens × vocabulary × 4 bytes: 1.6 GB for
GPT-2 small's batch of 8 × 1024), then keeps the float32 log-softmax for its backward,
and its backward makes two more whole-size tensors. Here:

* forward: per chunk of rows (`minitp.rules.loss_chunk_rows`), widen the chunk to float32
  and take its log-sum-exp. What is kept for backward is the logits themselves (which the
  output layer made anyway, in their own dtype) and one float32 number per token;
* backward: per chunk, softmax − one-hot, scaled, written into the gradient in the logits'
  dtype — the only whole-size tensor the backward makes.

Accumulation is float32 per chunk (float64 stays float64: in float64 this equals
`F.cross_entropy` to the last digits, which the tests check). The vocabulary-parallel loss
(`minitp.tensor_parallel.loss`) is the same computation with each rank holding a slice of
the vocabulary; on an axis of one rank it *is* this function.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..rules import IGNORE_INDEX, check_token_ids, loss_chunk_rows


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16-bit logits (a softmax over thousands of exponentials needs its digits),
    else the logits' own dtype (float64 stays float64)."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def chunks(tokens: int, rows: int | None):
    """(start, end) of each chunk of `rows` rows (None: one chunk of every row)."""
    rows = tokens if rows is None else max(1, rows)
    return [(s, min(s + rows, tokens)) for s in range(0, tokens, rows)]


def softmax_minus_one_hot(z: torch.Tensor, lse: torch.Tensor, target: torch.Tensor,
                          scale: torch.Tensor, acc: torch.dtype,
                          hit: torch.Tensor | None = None) -> torch.Tensor:
    """One chunk's gradient, (softmax(z) − one-hot(target)) · scale per row, in `acc`.

    z (r, w): logits; lse (r,): their log-sum-exp over the whole vocabulary (so that z's
    columns may be a slice of it); target (r,): a column of z per row; scale (r,): the
    gradient's factor per row (0 for an ignored target); hit (r,): 1 where the row's target
    is one of z's columns, 0 where it lives elsewhere (None: everywhere)."""
    p = torch.sub(z.to(acc), lse.unsqueeze(1)).exp_()  # a fresh float tensor: ours to change
    minus = -torch.ones_like(lse) if hit is None else -hit
    p.scatter_add_(1, target.unsqueeze(1), minus.unsqueeze(1))
    return p.mul_(scale.unsqueeze(1))


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, ignore_index, rows):  # (N, V), (N,)
        acc = accumulation_dtype(logits.dtype)
        ignored = targets == ignore_index
        lse = torch.empty(logits.shape[0], dtype=acc, device=logits.device)
        for s, e in chunks(logits.shape[0], rows):
            lse[s:e] = torch.logsumexp(logits[s:e].to(acc), dim=-1)
        target_logit = logits.gather(1, targets.masked_fill(ignored, 0).unsqueeze(1))
        per_token = (lse - target_logit.squeeze(1).to(acc)).masked_fill(ignored, 0.0)
        # kept: the logits and targets (which exist anyway) and one number per token
        ctx.save_for_backward(logits, lse, targets)
        ctx.rows, ctx.ignore_index = rows, ignore_index
        # all ignored: 0/0 = NaN, as F.cross_entropy's mean (backward still gives zeros)
        return per_token.sum() / (~ignored).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        logits, lse, targets = ctx.saved_tensors
        acc, ignored = lse.dtype, targets == ctx.ignore_index
        target = targets.masked_fill(ignored, 0)
        # one factor per row: the mean's 1/count, and 0 for an ignored target
        scale = (~ignored).to(acc) * (grad.to(acc) / (~ignored).sum().clamp(min=1))
        grad_logits = torch.empty_like(logits)
        for s, e in chunks(logits.shape[0], ctx.rows):
            grad_logits[s:e] = softmax_minus_one_hot(logits[s:e], lse[s:e], target[s:e],
                                                     scale[s:e], acc)
        return grad_logits, None, None, None


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                          ignore_index: int = IGNORE_INDEX, chunk_rows: int | None = None):
    """Mean cross-entropy of `targets` (...) under `logits` (..., V), `chunk_rows` tokens at a
    time (None: all at once). Equal to ``F.cross_entropy(logits.float(), targets)``, without
    the whole-size float32 copies. Targets must be in [0, V) or `ignore_index`."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} "
                         "disagree: targets must have the logits' shape without the last "
                         "(vocabulary) dimension")
    width = logits.shape[-1]
    return _ChunkedCrossEntropy.apply(logits.reshape(-1, width), targets.reshape(-1),
                                      ignore_index, chunk_rows)


class CrossEntropy(nn.Module):
    """The mean next-token loss over the targets that are not IGNORE_INDEX, in chunks of
    `minitp.rules.loss_chunk_rows` tokens (a model `d_model` wide)."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.vocab_size, self.d_model = vocab_size, d_model

    def forward(self, logits, targets):  # (B, T, V), (B, T)
        check_token_ids(targets, self.vocab_size, "target id", ignore_index=IGNORE_INDEX)
        rows = loss_chunk_rows(targets.numel(), logits.shape[-1], self.d_model)
        return chunked_cross_entropy(logits, targets, IGNORE_INDEX, rows)
