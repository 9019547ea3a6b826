# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex04
# Made from solutions/ex04_vocab_parallel_loss.py by `python -m minitp.course.make_exercises`.
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
        # hint: (0) padding: set columns with id >= vocab_size to -inf (masked_fill), so that
        # hint: exp() makes them 0. (1) m = all_reduce(row max, op="max"); shift = logits - m.
        # hint: (2) mine = targets in [start, start+width) and not ignored; pick
        # hint: shift[n, targets[n]-start] where mine, else 0; all_reduce (sum).
        # hint: (3) S = all_reduce(exp(shift).sum(-1)). loss_n = log S - target; average over
        # hint: the kept tokens; ctx.save_for_backward what backward needs (e.g. exp(shift), S).
        raise NotImplementedError(
            '(0) padding: set columns with id >= vocab_size to -inf (masked_fill), so that '
            'exp() makes them 0. (1) m = all_reduce(row max, op="max"); shift = logits - m. '
            '(2) mine = targets in [start, start+width) and not ignored; pick shift[n, '
            'targets[n]-start] where mine, else 0; all_reduce (sum). (3) S = '
            'all_reduce(exp(shift).sum(-1)). loss_n = log S - target; average over the kept '
            'tokens; ctx.save_for_backward what backward needs (e.g. exp(shift), S).'
        )

    @staticmethod
    def backward(ctx, grad_loss):
        # hint: softmax = exp(shift) / S[:, None] on this rank's columns; subtract 1 at
        # hint: [n, local target] for the tokens whose target this rank owns; zero the rows
        # hint: of ignored tokens; multiply by grad_loss / count. Return one gradient per
        # hint: forward input: (grad_logits, None, None, None, None).
        raise NotImplementedError(
            "softmax = exp(shift) / S[:, None] on this rank's columns; subtract 1 at [n, "
            'local target] for the tokens whose target this rank owns; zero the rows of '
            'ignored tokens; multiply by grad_loss / count. Return one gradient per forward '
            'input: (grad_logits, None, None, None, None).'
        )


def vocab_parallel_cross_entropy(local_logits, targets, axis, ignore_index=-100,
                                 vocab_size=None):
    """Mean cross-entropy of `targets` (...) under `local_logits` (..., w), split by vocabulary."""
    width = local_logits.shape[-1]
    return VocabParallelCrossEntropy.apply(local_logits.reshape(-1, width), targets.reshape(-1),
                                           axis, ignore_index, vocab_size)
