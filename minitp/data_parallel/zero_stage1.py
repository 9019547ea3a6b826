"""ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC 2020): the optimizer state split across dp.

The gradients, flattened into one buffer, are reduce-scattered (rank d receives the
summed d-th slice), the inner optimizer steps that slice only, and an all-gather
gives every rank the whole updated parameters. Adam's update is elementwise, so
stepping slices equals stepping the whole. Nothing happens during backward: a model
from ``mt.parallelize(..., zero_stage=1)`` has no all-reduce hooks, and
`mt.make_optimizer` builds the `Zero1Optimizer` that does the sum at its step.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..mixed_precision import MASTER_DTYPE, has_main_grads, zero_main_grads
from ..rules import round_up
from ..runtime import comm, trace
from ..runtime.mesh import Axis
from ..sharding.tags import dense_and_experts
from .grad_sync import grad_or_zeros


class ZeroOptimizerBase:
    """What every ZeRO optimizer answers through ``self.inner``, the optimizer that
    steps only this rank's shards (stage 1 here; stages 2 and 3: `minitp.data_parallel.zero`)."""

    def state_dict(self) -> dict:
        """The inner optimizer's state for this rank's shard (only this dp rank's slice)."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds (Adam: 2 per shard element, + steps)."""
        return sum(t.numel() for s in self.inner.state.values() for t in s.values()
                   if torch.is_tensor(t))


class FlatShard:
    """One flat vector of parameters over one axis: the parameters concatenated, padded
    to a multiple of the axis size, and this rank's slice of it (the shard it steps)."""

    def __init__(self, params: list[nn.Parameter], axis: Axis, mixed: bool):
        self.params, self.axis = params, axis
        numel = sum(p.numel() for p in params)
        self.padded = round_up(numel, axis.size)  # equal slices for the collectives
        self.shard_size = self.padded // axis.size
        lo = axis.rank * self.shard_size
        shard = self.flatten([p.detach() for p in params])[lo:lo + self.shard_size]
        # Under mixed precision the shard is this rank's float32 master slice.
        self.shard = nn.Parameter(shard.to(MASTER_DTYPE) if mixed else shard.clone())

    def flatten(self, tensors) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.padded - flat.numel()))

    def reduce_grads(self) -> None:
        grads = [grad_or_zeros(p) for p in self.params]
        with trace.label("zero1 grads"), trace.phase("bwd"):
            self.shard.grad = comm.reduce_scatter(self.flatten(grads), self.axis)

    def gather_params(self) -> None:
        with trace.label("zero1 params"):  # in the parameters' dtype: bf16 travels as bf16
            flat = comm.all_gather(self.shard.detach().to(self.params[0].dtype), self.axis)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


class Zero1Optimizer(ZeroOptimizerBase):
    """An optimizer whose state lives only for this dp rank's 1/dp of the parameters.

    ``step()``: reduce-scatter the flat gradient over dp (sum), step the shard with
    the inner optimizer, all-gather the updated shards into every parameter. Expert
    shards (expert parallelism, tag ``ep_split_dim``) make a second flat vector over
    `expert_axis`, the ranks that hold the same experts (`Mesh.expert_dp`).
    """

    def __init__(self, params: list[nn.Parameter], axis: Axis, optimizer_class,
                 expert_axis: Axis | None = None, **kwargs):
        params = [p for p in params if p.requires_grad]
        self.mixed = has_main_grads(params)
        dense, experts = dense_and_experts(params)
        self.flats = [FlatShard(group, group_axis, self.mixed)
                      for group, group_axis in ((dense, axis), (experts, expert_axis)) if group]
        self.params = [p for flat in self.flats for p in flat.params]
        shards = [flat.shard for flat in self.flats]
        self.masters = shards if self.mixed else []
        self.inner = optimizer_class(shards, **kwargs)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state
        self.reduced = False

    @property
    def padded(self) -> int:
        """Elements of the flat vector(s) this optimizer shards, padding included."""
        return sum(flat.padded for flat in self.flats)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.mixed:
            zero_main_grads(self.params)
            return
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def reduce_grads(self) -> None:
        """The reduce-scatter of the step, now (global-norm clipping reads the shards'
        summed gradients before the step); ``step()`` then does not repeat it."""
        if not self.reduced:
            for flat in self.flats:
                flat.reduce_grads()
            self.reduced = True

    def step(self) -> None:
        self.reduce_grads()
        self.reduced = False
        self.inner.step()
        for flat in self.flats:
            flat.gather_params()
