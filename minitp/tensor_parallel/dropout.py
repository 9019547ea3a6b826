"""Dropout for tensor-parallel regions: the same mask where activations are
replicated, different masks where they are sharded.

Replicated activations (the residual stream without sequence parallelism) must
be dropped identically on every tensor-parallel rank, or the ranks' copies
drift apart: plain ``nn.Dropout`` on the default generator does that, since
every rank seeds it the same. Sharded activations (each rank's attention heads,
or its sequence shard under sequence parallelism) must get *independent* masks,
or rank 1's heads would repeat rank 0's pattern.

`ShardedDropout` draws a seed from the default generator (the same on every
rank, so it stays replicated) and offsets it by the tensor-parallel rank. Since
the seed comes from the default generator, activation recomputation — which
restores that generator's state before recomputing — reproduces the same masks.

What it keeps for backward is the mask alone, as ``bool``: one byte per
element, as Korthikanti et al. (2022) count it. (``x * keep / (1 - p)`` would
keep ``keep`` in the activation dtype, 2 or 4 bytes, and autograd would also
keep the Python number 1 - p as an 8-byte tensor.)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..runtime.mesh import Axis

_RANK_STRIDE = 104_729  # a prime: rank offsets never collide for any sane seed


class _ApplyMask(torch.autograd.Function):
    """fwd: y = x·keep / (1 − p) · bwd: dx = dy·keep / (1 − p); saves only ``keep`` (bool)."""

    @staticmethod
    def forward(ctx, x, keep, p):
        ctx.save_for_backward(keep)
        ctx.p = p
        return x.masked_fill(~keep, 0) / (1.0 - p)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.masked_fill(~keep, 0) / (1.0 - ctx.p), None, None


class ShardedDropout(nn.Module):
    """Dropout with a mask that differs across the ranks of `axis`."""

    def __init__(self, p: float, axis: Axis):
        super().__init__()
        self.p, self.axis = p, axis

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        seed = int(torch.randint(0, 2**62, (1,)).item())  # replicated: same on every rank
        generator = torch.Generator(device=x.device)
        generator.manual_seed(seed + _RANK_STRIDE * (self.axis.rank + 1))
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=generator).bool()
        return _ApplyMask.apply(x, keep, self.p)

    @classmethod
    def from_dense(cls, module: nn.Dropout, axis: Axis) -> ShardedDropout:
        return cls(module.p, axis)

    def extra_repr(self) -> str:
        return f"p={self.p}, independent masks across {self.axis.name} ranks"
