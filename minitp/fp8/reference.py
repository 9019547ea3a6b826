"""The one-process FP8 run that every mesh must equal.

Without FP8 a step's gradient does not depend on how the batch is cut into microbatches.
With it, it does: tensorwise scaling casts each microbatch with that microbatch's amax, and
delayed scaling records one amax per microbatch. So "the one-process run" of a parallel
step must be the same *microbatches* run in one process, one after another, their gradients
accumulated — not the whole batch at once:

* microbatch i of the one process is microbatch i of every data-parallel rank, side by
  side (dp rank d holds rows [d·B/dp, (d+1)·B/dp) and cuts them into `microbatches` slices,
  as `mt.train_step`): the dp ranks cast microbatch i together, their amax reduced over dp;
* context parallelism cuts each microbatch along the sequence, tensor and sequence
  parallelism each tensor: the amax groups put those pieces back together (nothing to cut
  here);
* a pipeline runs the same microbatches in another order, but each layer still sees
  microbatch 0, 1, … in turn, forward and backward: a delayed history records them in the
  same order.

Each microbatch's loss is weighted by its share of the batch's (non-ignored) targets, as
`mt.train_step` weighs it, so the step's loss is the batch mean.
"""

from __future__ import annotations

import torch

from ..rules import IGNORE_INDEX


def one_process_microbatches(batch, dp: int = 1, microbatches: int = 1) -> list[tuple]:
    """The (x, y) microbatches of the one-process FP8 run of a step with `dp` data-parallel
    ranks each cutting its rows into `microbatches`: microbatch i is every dp rank's i-th,
    in rank order."""
    x, y = batch[:2]
    if x.shape[0] % (dp * microbatches):
        raise ValueError(f"a batch of {x.shape[0]} rows does not split into dp={dp} ranks of "
                         f"{microbatches} equal microbatches")
    per_rank = [(xs.chunk(microbatches), ys.chunk(microbatches))
                for xs, ys in zip(x.chunk(dp), y.chunk(dp), strict=True)]
    return [(torch.cat([xs[i] for xs, _ in per_rank]), torch.cat([ys[i] for _, ys in per_rank]))
            for i in range(microbatches)]


def accumulate(model, batch, dp: int = 1, microbatches: int = 1) -> float:
    """Forward and backward of the plain FP8 model (`minitp.fp8.convert`) over the
    microbatches a (dp, microbatches) step casts together, the gradients accumulated;
    returns the batch's mean loss."""
    total = int((batch[1] != IGNORE_INDEX).sum())
    loss = 0.0
    for xs, ys in one_process_microbatches(batch, dp, microbatches):
        share = int((ys != IGNORE_INDEX).sum()) / total
        _, mean = model(xs, ys)
        if share:  # a microbatch with no targets has no mean (and no gradient)
            (mean * share).backward()
            loss += mean.item() * share
    return loss


def reference_step(model, batch, optimizer, dp: int = 1, microbatches: int = 1) -> float:
    """One optimizer step of the one-process FP8 run (`accumulate`, then the step)."""
    optimizer.zero_grad()
    loss = accumulate(model, batch, dp, microbatches)
    optimizer.step()
    return loss
