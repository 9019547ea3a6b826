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
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .mesh import Axis

_RANK_STRIDE = 104_729  # a prime: rank offsets never collide for any sane seed


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
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=generator)
        return x * keep / (1.0 - self.p)

    @classmethod
    def from_dense(cls, module: nn.Dropout, axis: Axis) -> ShardedDropout:
        return cls(module.p, axis)

    def extra_repr(self) -> str:
        return f"p={self.p}, independent masks across {self.axis.name} ranks"
