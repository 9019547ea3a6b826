"""Exercise 04: the cross-entropy of logits split by vocabulary, never gathered.

Every rank of `axis` holds the logits of its own vocabulary range: rank i has
columns [i·w, (i+1)·w) of a vocabulary padded to t·w (w = local_logits.shape[-1]).
Columns at or beyond `vocab_size` are padding and must take no part. For token
n with target y, the loss is

    loss_n = log Σ_v exp(z_{n,v}) − z_{n,y}

and the result is the mean over the tokens whose target is not `ignore_index`.
Three all-reduces of ONE number per token give every rank what it needs:

1. m = max over the whole vocabulary          (mt.comm.all_reduce(..., op="max"))
2. z_y − m, from the one rank that owns y     (sum; the other ranks add 0)
3. S = Σ_v exp(z_v − m)                       (sum of each rank's own columns)

so that loss_n = log S − (z_y − m). The backward needs no communication: the
gradient of the mean loss for column v of token n is (softmax_v − [v = y]) / count,
and 0 for ignored tokens; each rank has all of that for its own columns.

Grade it with `mt.grade("ex04")` in a notebook or `python -m minitp.course.grade ex04`.
"""

import torch

import minitp as mt


class VocabParallelCrossEntropy(torch.autograd.Function):
    """fwd: mean cross-entropy from three all-reduces · bwd: softmax − one-hot, no communication."""

    @staticmethod
    def forward(ctx, logits, targets, axis, ignore_index, vocab_size):
        # logits: (N, w) this rank's columns; targets: (N,) ids in [0, vocab_size) or ignore_index
        width = logits.shape[-1]
        start = axis.rank * width  # the first vocabulary id this rank owns
        # BEGIN SOLUTION
        # hint: (0) padding: set columns with id >= vocab_size to -inf (masked_fill), so that
        # hint: exp() makes them 0. (1) m = all_reduce(row max, op="max"); shift = logits - m.
        # hint: (2) mine = targets in [start, start+width) and not ignored; pick
        # hint: shift[n, targets[n]-start] where mine, else 0; all_reduce (sum).
        # hint: (3) S = all_reduce(exp(shift).sum(-1)). loss_n = log S - target; average over
        # hint: the kept tokens; ctx.save_for_backward what backward needs (e.g. exp(shift), S).
        if vocab_size is not None and start + width > vocab_size:
            ids = torch.arange(start, start + width, device=logits.device)
            logits = logits.masked_fill(ids >= vocab_size, float("-inf"))  # padding: exp -> 0
        global_max = mt.comm.all_reduce(logits.max(dim=-1).values, axis, op="max")  # (N,)
        shifted = logits - global_max.unsqueeze(-1)  # (N, w), every entry <= 0

        kept = targets != ignore_index
        mine = kept & (targets >= start) & (targets < start + width)
        local_target = (targets - start).clamp(0, width - 1)  # any valid column where not mine
        picked = shifted.gather(1, local_target.unsqueeze(1)).squeeze(1)  # (N,)
        target_logit = mt.comm.all_reduce(torch.where(mine, picked, 0.0), axis)  # z_y - m

        exp = shifted.exp()
        sum_exp = mt.comm.all_reduce(exp.sum(dim=-1), axis)  # (N,)

        per_token = torch.where(kept, sum_exp.log() - target_logit, 0.0)
        count = int(kept.sum())
        ctx.count = count
        ctx.save_for_backward(exp, sum_exp, local_target, mine, kept)
        return per_token.sum() / count
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad_loss):
        # BEGIN SOLUTION
        # hint: softmax = exp(shift) / S[:, None] on this rank's columns; subtract 1 at
        # hint: [n, local target] for the tokens whose target this rank owns; zero the rows
        # hint: of ignored tokens; multiply by grad_loss / count. Return one gradient per
        # hint: forward input: (grad_logits, None, None, None, None).
        exp, sum_exp, local_target, mine, kept = ctx.saved_tensors
        grad = exp / sum_exp.unsqueeze(-1)  # softmax over the whole vocabulary, my columns
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows[mine], local_target[mine]] -= 1.0
        grad[~kept] = 0.0
        grad *= grad_loss / ctx.count
        return grad, None, None, None, None
        # END SOLUTION


def vocab_parallel_cross_entropy(local_logits, targets, axis, ignore_index=-100,
                                 vocab_size=None):
    """Mean cross-entropy of `targets` (...) under `local_logits` (..., w), split by vocabulary."""
    width = local_logits.shape[-1]
    return VocabParallelCrossEntropy.apply(local_logits.reshape(-1, width), targets.reshape(-1),
                                           axis, ignore_index, vocab_size)
