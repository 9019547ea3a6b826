"""One optimizer step of a model parallelized by PyTorch (`minitp.torch_parallel.parallelize`).

The same contract as `mt.train_step`: the global batch on every rank, data-parallel rank d
takes rows [d·B/dp, (d+1)·B/dp), each of its `microbatches` slices runs forward and
backward, then one optimizer step; it returns the loss of the whole batch, the mean over
its non-ignored target tokens, the same float on every rank.

What torch does in it: FSDP2's hooks gather and free the parameters and reduce-scatter
(HSDP: and all-reduce) the gradients; DTensor's styles do the tensor-parallel collectives.
What is left to this step: the loss's weights (each slice's share of the batch's target
tokens, FSDP2's own division turned off in `minitp.torch_parallel.fsdp`), and, under
sequence parallelism, the norms' gradients, which DTensor leaves ``Partial`` over tp
(each tp rank saw a piece of the sequence): they are summed by ``redistribute``, one
all-reduce each — minitp sums the same gradients in one flattened all-reduce
(`minitp.tensor_parallel.partial_grads`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from ..rules import IGNORE_INDEX
from ..step.train import unpack_batch


class ParallelCrossEntropy(nn.Module):
    """torch's cross-entropy in the GPT's loss place. On vocab-sharded DTensor logits,
    inside ``loss_parallel()``, it is the vocab-parallel loss; on plain logits the plain
    one (minitp's chunked loss equals it in float64)."""

    def forward(self, logits, targets):
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


def _loss_context(model):
    return loss_parallel() if model.mesh.tp.size > 1 else contextlib.nullcontext()


def sum_partial_grads(model: nn.Module) -> None:
    """Every gradient DTensor left ``Partial`` made whole (``redistribute`` to the
    parameter's placements: an all-reduce over the axis it was partial on)."""
    for p in model.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, p.placements)


def full_state_dict(model: nn.Module) -> dict:
    """Every tensor of `model`'s state, whole (DTensors gathered: a collective on every
    rank), under the plain GPT's names."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach()
            for k, v in model.state_dict().items()}


def train_step(model, batch, optimizer, microbatches: int = 1) -> float:
    """Forward and backward of this data-parallel rank's slices, then `optimizer`'s step.
    batch: (x, y), or (x, y, positions) for packed documents (`minitp.data.packing`),
    checked as `mt.train_step` checks it; positions are sliced by rows with x, and the
    model (the plain GPT's forward under torch's styles) masks and places by them."""
    x, y, positions = unpack_batch(batch)
    mesh = model.mesh
    dp, d = mesh.dp.size, mesh.dp.rank
    rows = x.shape[0] // dp
    mine = slice(d * rows, (d + 1) * rows)
    xs, ys = x[mine].chunk(microbatches), y[mine].chunk(microbatches)
    packed = [None] * len(xs) if positions is None else positions[mine].chunk(microbatches)
    total = max(int((y != IGNORE_INDEX).sum()), 1)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    for xm, ym, pm in zip(xs, ys, packed, strict=True):
        share = int((ym != IGNORE_INDEX).sum()) / total  # a Python float: exact in float64
        with _loss_context(model):
            _, loss = model(xm, ym, positions=pm)
            loss = loss * share
            loss.backward()
        loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
        if share:  # a slice whose targets are all ignored: its mean is 0/0, weighed 0
            loss_sum += loss.detach().to(torch.float64)
    sum_partial_grads(model)
    optimizer.step()
    if dp > 1:
        dist.all_reduce(loss_sum, group=mesh.dp.group)
    return loss_sum.item()
