"""Summing the gradients sequence parallelism leaves partial on each rank.

Under sequence parallelism a replicated parameter applied to a sequence shard
(a LayerNorm, the position embedding, a row-parallel bias) sees only that
shard's tokens, so each tensor-parallel rank holds one term of its gradient.
The true gradient is the sum over the group (forgetting it is the bug behind
Megatron-LM issue #1446). Both the single-stage and the pipelined model call this.
"""

from __future__ import annotations

import torch

from ..mixed_precision import grad_of, set_grad
from ..runtime import comm, trace
from ..runtime.mesh import Axis


def sum_partial_grads(params, tp: Axis) -> None:
    """Sum `params`' gradients over `tp`: one all-reduce of all of them flattened
    together, rather than one per parameter."""
    params = [p for p in params if grad_of(p) is not None]
    if not params or tp.size == 1:
        return
    flat = torch.cat([grad_of(p).reshape(-1) for p in params])
    with trace.label("sequence-parallel grads"), trace.phase("bwd"):
        flat = comm.all_reduce(flat, tp)
    for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
        set_grad(p, g)
