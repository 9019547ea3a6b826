"""ZeRO stage 3: only the shards stay in the model; a unit's parameters are gathered just
before its forward, freed after, gathered again for its backward, whose gather's
backward reduce-scatters the gradient (see `minitp.data_parallel.zero`)."""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn

from ..recompute import Recomputed
from ..runtime import trace
from .zero_units import Unit, _piece_module


class _GatherParams(torch.autograd.Function):
    """fwd: all-gather a unit's shards over dp · bwd: reduce-scatter its gradient
    (the conjugate pair of `minitp.tensor_parallel.mappings`, applied to parameters)."""

    @staticmethod
    def forward(ctx, shard, unit, then_post):
        ctx.unit = unit
        full = unit.take_gathered(then_post)
        ctx.full = None
        return full

    @staticmethod
    def backward(ctx, grad):
        ctx.unit.start_reduce(grad)
        full = ctx.full() if ctx.full is not None else None
        if full is not None:  # the values gathered again for backward: used, freed
            full.untyped_storage().resize_(0)
        return None, None, None


def _free(full: torch.Tensor) -> None:
    full.untyped_storage().resize_(0)


def _refill(unit: Unit, full: torch.Tensor, then_post: Unit | None) -> None:
    """Gather the unit again into `full`'s (freed) storage, for its backward, and post
    the gather of `then_post` (the unit backward reaches next). Through ``.data``:
    autograd's saved views must not see a version bump (no value changed)."""
    storage = full.untyped_storage()
    if storage.nbytes() == 0:
        with trace.phase("bwd"):
            values = unit.take_gathered(then_post)
        storage.resize_(full.numel() * full.element_size())
        full.data.copy_(values)


class Zero3Unit:
    """Stage 3's hooks on a unit's modules: gather before forward, free after; gather
    again when backward reaches it. `order`: the stage's (unit, trigger module) uses in
    forward order, to know which unit to prefetch next (forward) or before (backward)."""

    def __init__(self, unit: Unit, order: list[tuple[Unit, nn.Module]]):
        self.unit, self.current = unit, None
        self.neighbours = {id(module): (order[i - 1][0] if i > 0 else None,
                                        order[i + 1][0] if i + 1 < len(order) else None)
                           for i, (u, module) in enumerate(order) if u is unit}
        for module, attr, p, _ in unit.layout:
            del module._parameters[attr]  # the module reads the gathered view instead
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)  # the shard holds it now
        for module in unit.triggers:
            module.register_forward_pre_hook(self.before)
            module.register_forward_hook(self.after, always_call=True)

    def before(self, module, args) -> None:
        unit = self.unit
        previous, following = self.neighbours[id(module)]
        recomputing = trace._in_backward()
        if recomputing:  # the forward runs again in backward: views that require grad,
            # as the first time (autograd saves the same tensors), but no gather node;
            # backward goes on to the unit before this one: fetch it meanwhile
            full = unit.take_gathered(previous).requires_grad_()
        elif torch.is_grad_enabled():
            full = _GatherParams.apply(unit.shard, unit, following)
        else:
            full = unit.take_gathered(following)
        full.zero_gathered = True  # model state, not an activation (`minitp.memory`'s ledger)
        full.reduce_grad = unit.start_reduce  # where a deferred W sends its gradients
        for mod, attr, _, view in unit.views(full):
            object.__setattr__(mod, attr, view)
        self.current = full

    def after(self, module, args, output) -> None:
        full, self.current = self.current, None
        for mod, attr, _, _ in self.unit.layout:
            mod.__dict__.pop(attr, None)
        if full is None or trace._in_backward():
            return  # a recomputation's values are about to be used: keep them
        _free(full)
        if (full.grad_fn is not None and not self.unit.recomputed
                and isinstance(output, torch.Tensor) and output.requires_grad):
            full.grad_fn.full = weakref.ref(full)  # ctx: so backward can free the refill
            unit, previous = self.unit, self.neighbours[id(module)][0]
            output.register_hook(lambda grad: _refill(unit, full, previous))


def shard_parameters(stage: nn.Module, units: list[Unit]) -> None:
    """Stage 3: each unit's parameters replaced by its shard, gathered around use."""
    order = []  # (unit, trigger) in forward order: the lookup first, the head last
    for unit in units:
        if unit.tied:  # the embedding's lookup and, on the last stage, the output head
            unit.triggers = ([stage.wte] if stage.first else []) + ([stage.head]
                                                                    if stage.last else [])
            order += [(unit, stage.wte)] if stage.first else []
        else:
            module = _piece_module(stage, unit.name)
            # under full recomputation a block runs its forward again in backward: its
            # own unit (the Recomputed wrapper) and its experts' unit, inside it
            unit.recomputed = isinstance(module, Recomputed) or ".module." in unit.name
            unit.triggers = [module.module if isinstance(module, Recomputed) else module]
            order.append((unit, unit.triggers[0]))
    order += [(u, stage.head) for u in units if u.tied and stage.last]
    for unit in units:
        Zero3Unit(unit, order)
    # the shards are the stage's parameters now (its device, its dtype, the optimizer's)
    stage.zero_shards = nn.ParameterList([u.shard for u in units])
