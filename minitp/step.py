"""One optimizer step of a parallel model: `mt.train_step`."""

from __future__ import annotations

import torch

from .mesh import Mesh

SCHEDULES = (None, "gpipe", "1f1b", "interleaved")
IGNORE_INDEX = -100


def train_step(model, batch, mesh: Mesh, optimizer, schedule=None, microbatches: int = 1) -> float:
    """Forward and backward over `microbatches` slices of the global batch, the
    partial gradients summed where sequence parallelism left them partial, then
    one optimizer step. Returns the loss of the whole batch — the mean over its
    (non-ignored) target tokens, exactly as one device computes it — the same
    float on every rank.

    batch: (x, y), LongTensors (batch, seq_len), the same global batch on every rank.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    x, y = batch
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"batch must be (x, y) of equal shape (batch, seq_len), got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    if not isinstance(microbatches, int) or microbatches < 1 or x.shape[0] % microbatches:
        raise ValueError(f"microbatches={microbatches!r} must be a positive integer dividing "
                         f"the batch size {x.shape[0]}")
    optimizer.zero_grad(set_to_none=True)
    # Weight each microbatch by its share of the batch's target tokens, so the
    # accumulated gradient is that of the batch mean (not a mean of means).
    # (Python ints: dividing two LongTensors would give float32 and cost 1e-8 in float64.)
    total = int((y != IGNORE_INDEX).sum())
    loss_sum = torch.zeros((), dtype=torch.float64)
    for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
        count = int((ys != IGNORE_INDEX).sum())
        if count == 0:
            continue  # nothing to learn from; its mean loss would be 0/0
        _, loss = model(xs, ys)
        weighted = loss * (count / total)
        weighted.backward()
        loss_sum += weighted.detach().double().cpu()
    model.sync_partial_grads()
    optimizer.step()
    return float(loss_sum)
