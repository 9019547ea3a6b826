"""ZeRO stage 2: each unit's gradient reduce-scattered as soon as backward has produced
it, and the whole-size gradients dropped at once (see `minitp.data_parallel.zero`)."""

from __future__ import annotations

import torch
import torch.nn as nn

from .zero_units import Unit


class ShardedGradSync:
    """ZeRO-2's gradient reduction for one stage: when every parameter of a unit has
    its gradient, the unit's flat gradient is reduce-scattered and the whole-size
    gradients are dropped. Every microbatch (``arm`` is accepted and ignored).

    Under a zero-bubble schedule a backward comes in two parts
    (`minitp.tensor_parallel.weight_grad`): B brings a unit's LayerNorm and bias gradients, W,
    perhaps after the next microbatch's B, its linear weights'. The count still works: each of
    the step's m·len(layout) arrivals is counted once, so the unit is reduced at every
    len(layout)-th one and the last reduction comes with the last arrival; whatever a reduction
    finds in the whole-size gradients (part of one microbatch, part of the next) is reduced
    once, and reduce-scatter is linear, so the shard ends with the sum."""

    def __init__(self, units: list[Unit]):
        self.units = units
        self._unit_of = {id(p): u for u in units for _, _, p, _ in u.layout}
        self._arrived = {id(u): 0 for u in units}
        self.handles = [p.register_post_accumulate_grad_hook(self._ready)
                        for u in units for _, _, p, _ in u.layout]

    def arm(self, armed: bool = True) -> None:
        pass  # every microbatch's gradient is reduced and dropped at once

    def _ready(self, p: nn.Parameter) -> None:
        unit = self._unit_of[id(p)]
        self._arrived[id(unit)] += 1
        if self._arrived[id(unit)] == len(unit.layout):
            self._arrived[id(unit)] = 0
            params = [q for _, _, q, _ in unit.layout]
            flat = unit.flatten([q.grad if q.grad is not None else torch.zeros_like(q)
                                 for q in params])
            for q in params:
                q.grad = None  # only the shard's gradient outlives this unit's backward
            unit.start_reduce(flat)

    def finish(self) -> None:
        for unit in self.units:
            unit.finish_reduce()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
