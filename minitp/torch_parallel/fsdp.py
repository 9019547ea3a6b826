"""Data parallelism by FSDP2 (``torch.distributed.fsdp.fully_shard``), and HSDP.

``fully_shard(module, mesh=...)`` replaces each of the module's parameters by a DTensor
sharded along its dim 0 over the data-parallel ranks (``Shard(0)``: per-parameter
sharding; minitp's ZeRO-3 flattens a unit's parameters into one vector and shards that).
The module's parameters form one group, gathered together before its forward (one
all-gather for all of them) and freed after it, gathered again for its backward, whose
gradients are reduce-scattered together: the group is ZeRO-3's *unit*. As minitp's units
are, the groups here are each transformer block, and the rest (the root call on the whole
model): token and position embeddings, the final norm and the head tied to the embedding
— one group, because the tied weight must be gathered once for both its uses. minitp keeps
the embedding, the positions and the final norm as three units.

With a 2-D data-parallel mesh ("dp_replicate", "dp_shard") the same call is HSDP: each
parameter is ``(Replicate(), Shard(0))``, sharded inside a replica group and replicated
across; a gradient is reduce-scattered inside the group, then its shard all-reduced across
replicas. Over a tensor-parallel DTensor it composes: a ColwiseParallel weight becomes
``(Shard(0) over dp, Shard(0) over tp)`` — FSDP2 shards the tp shard further ("2-D").

The gradient's mean over data-parallel ranks: FSDP2 divides by the number of ranks by
default. We set the divide factor to 1 (a sum) and scale each rank's loss by its share
of the batch's target tokens instead, so that ignored targets weigh as one device weighs
them (as `mt.train_step` does). For float32 and bf16 FSDP2 would then reduce with
``ReduceOp.PREMUL_SUM(1/factor)``, which gloo refuses ("Cannot use ReduceOp.PREMUL_SUM with
Gloo", torch 2.13); ``set_force_sum_reduction_for_comms(True)`` makes every reduction a
plain SUM (the factor, 1, then applied as a no-op post-division).
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from .device_mesh import data_dims


def data_mesh(dm: DeviceMesh) -> DeviceMesh | None:
    """The data-parallel part of `dm` (1-D for FSDP, 2-D for HSDP); None with one rank."""
    dims = data_dims(dm)
    sub = dm[dims] if len(dims) > 1 else dm[dims[0]]
    return sub if sub.size() > 1 else None


def apply_fully_shard(model: nn.Module, dm: DeviceMesh, reshard_after_forward: bool = True):
    """Each block its own FSDP2 group, the rest of `model` the root's (changed in place)."""
    mesh = data_mesh(dm)
    if mesh is None:
        return
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM
