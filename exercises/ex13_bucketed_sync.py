# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex13
# Made from solutions/ex13_bucketed_sync.py by `python -m minitp.course.make_exercises`.
"""Exercise 13: bucketed gradient sync, overlapped with backward.

Every data-parallel rank of `axis` runs backward on its own slice of the
global batch, its loss weighted by its share of the batch's counted tokens (as
`mt.train_step` does), so each ``p.grad`` holds one term of the sum
∇L = Σ_d (n_d / N) ∇L_d. `OverlappedGradSync` must turn every ``p.grad`` into
that sum over the ranks — and send while backward is still running, not after.

The buckets (the grader counts them): walk the parameters in *reverse* order
(backward reaches the last layers first); a parameter joins the current bucket
unless the bucket is not empty and its gradient (``p.numel() * p.element_size()``
bytes) would take the bucket over `bucket_bytes`, in which case it opens the
next bucket. Each bucket is summed with ONE all-reduce of its gradients
flattened into one tensor (a sum: the weighting already made the division).

What you need:

* ``p.register_post_accumulate_grad_hook(hook)``: autograd calls ``hook(p)``
  during backward, as soon as ``p.grad`` holds this backward's gradient;
* ``mt.comm.all_reduce_start(flat, axis)`` starts a sum over the ranks and
  returns a `Pending` at once; its ``wait()`` returns the sum (a new tensor).
  The trace records it from the start to the end of the wait.

``__init__`` builds the buckets and hooks the parameters; during each backward
a bucket's all-reduce starts as soon as its gradients are all there; ``finish()``,
called after backward and before the optimizer step, waits for them and puts the
sums into the ``.grad`` s. The object serves step after step.

Grade it with `mt.grade("ex13")` in a notebook or `python -m minitp.course.grade ex13`:
two steps at dp = 2 and 4 in float64, checked against the plain model's
gradients, bucket by bucket, and on the trace: each all-reduce must start
inside the backward and be waited for after it.
"""

import torch

import minitp as mt


class OverlappedGradSync:
    """Sum the gradients of `params` over `axis` in buckets, during backward."""

    def __init__(self, params: list[torch.nn.Parameter], axis: mt.Axis, bucket_bytes: int):
        # hint: Besides the buckets, keep what a hook needs to know when its bucket is
        # hint: complete, and what finish() needs to find the sums.
        raise NotImplementedError(
            'Besides the buckets, keep what a hook needs to know when its bucket is complete,'
            ' and what finish() needs to find the sums.'
        )

    def _ready(self, p: torch.nn.Parameter) -> None:
        """Called by autograd during backward, once ``p.grad`` is final."""
        # hint: Is p the last of its bucket to arrive? Then its all-reduce can start now.
        raise NotImplementedError(
            'Is p the last of its bucket to arrive? Then its all-reduce can start now.'
        )

    def finish(self) -> None:
        """After backward, before the optimizer step: every ``p.grad`` becomes the sum."""
        # hint: Wait in bucket order, the same on every rank, and leave everything ready
        # hint: for the next step's backward.
        raise NotImplementedError(
            'Wait in bucket order, the same on every rank, and leave everything ready for the'
            " next step's backward."
        )
