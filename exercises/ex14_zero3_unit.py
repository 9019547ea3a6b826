# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex14
# Made from solutions/ex14_zero3_unit.py by `python -m minitp.course.make_exercises`.
"""Exercise 14: one ZeRO-3 unit — gather before forward, free after, gather again
for backward, reduce-scatter the gradient.

ZeRO stage 3 (Rajbhandari et al. 2020; FSDP is the same design) keeps no whole
parameters anywhere. A *unit* (a layer, a block) has Ψ_u parameter values,
flattened into one vector and padded with zeros to a multiple of N (the
data-parallel size, ``axis.size``); rank d keeps only the d-th of the N equal
slices, its *shard*, and the optimizer steps only that. Around each use:

* forward: all-gather the shards into the whole vector, run the module on views
  of it, and **free** the vector as soon as the output is computed — between
  the forward and the backward a rank holds its shard and nothing more;
* backward: all-gather **again**, run the module again (with gradients this
  time) to get the gradients of the input and of the whole vector, then
  **reduce-scatter** the vector's gradient: every rank's gradient summed over
  the ranks, each rank keeping its own slice (the gradient of its shard). Free
  the vector again.

That is 3 collectives of Ψ_u values per unit per step (gather, gather,
reduce-scatter) where plain data parallelism makes 2 (one all-reduce): the
paper's 3Ψ against 2Ψ. An all-reduce of the gradient would give every rank the
whole sum: N times the gradient memory a shard needs, and more bytes on the wire.

Here the unit reruns its forward in backward (the activations inside the unit
are not kept: only its input is), so backward's gather is the only way to get
the parameters back. `minitp.data_parallel.zero` keeps the activations instead and refills
the freed storage; the collectives are the same.

What you need:

* ``mt.comm.all_gather(shard, axis)``: every rank's shard, in rank order, one
  vector (rank r's slice is the r-th block);
* ``mt.comm.reduce_scatter(flat, axis)``: the sum over the ranks, this rank
  keeping the ``axis.rank``-th of N equal blocks;
* `run_module(unit, full, x)` (given): the module's forward with its parameters
  read from views of the whole vector `full`;
* ``torch.autograd.grad(outputs, inputs, grad_outputs)``.

Grade it with `mt.grade("ex14")` in a notebook or `python -m minitp.course.grade ex14`:
two units in a row, two SGD steps on the shards, at dp = 2 and 4 in float64,
against the plain module on the whole batch; the trace must show one all-gather
before each forward, one in backward and one reduce-scatter, and no gathered
vector may outlive its forward (nor its backward).
"""

import torch
import torch.nn as nn

import minitp as mt


class Zero3Unit(nn.Module):
    """`module`'s parameters sharded over `axis`: this rank keeps ``self.shard``."""

    def __init__(self, module: nn.Module, axis: mt.Axis):
        super().__init__()
        self.axis = axis
        self.names = [name for name, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.numel = sum(p.numel() for p in module.parameters())  # Ψ_u
        self.padded = -(-self.numel // axis.size) * axis.size  # Ψ_u rounded up to N's multiple
        self.shard_size = self.padded // axis.size
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        flat = nn.functional.pad(flat, (0, self.padded - self.numel))  # zeros at the end
        # hint: this rank's slice of `flat`: shard_size values starting at axis.rank * shard_size,
        # hint: copied (clone) into an nn.Parameter, so the optimizer steps it
        raise NotImplementedError(
            "this rank's slice of `flat`: shard_size values starting at axis.rank * "
            'shard_size, copied (clone) into an nn.Parameter, so the optimizer steps it'
        )
        for p in module.parameters():  # the module keeps no values of its own now
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GatherRunFree.apply(x, self.shard, self)


def run_module(unit: Zero3Unit, full: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The module's forward on `x`, its parameters views of the whole vector `full`."""
    views, offset = {}, 0
    for name, shape in zip(unit.names, unit.shapes, strict=True):
        views[name] = full[offset:offset + shape.numel()].view(shape)
        offset += shape.numel()
    return torch.func.functional_call(unit.module, views, (x,))


class GatherRunFree(torch.autograd.Function):
    """fwd: gather, run, free · bwd: gather again, run again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, unit):
        ctx.unit = unit
        # hint: gather the whole vector from the shards, run the module on it, and keep
        # hint: for backward only what you must: the input (ctx.save_for_backward), not the vector
        raise NotImplementedError(
            'gather the whole vector from the shards, run the module on it, and keep for '
            'backward only what you must: the input (ctx.save_for_backward), not the vector'
        )

    @staticmethod
    def backward(ctx, grad_y):
        unit = ctx.unit
        # hint: gather again; run the module again with gradients on (torch.enable_grad()),
        # hint: on a detached input and vector that require grad; torch.autograd.grad gives
        # hint: their gradients; sum the vector's over the ranks keeping this rank's slice.
        # hint: Return one gradient per forward input: (grad_x, grad_shard, None)
        raise NotImplementedError(
            'gather again; run the module again with gradients on (torch.enable_grad()), on a'
            ' detached input and vector that require grad; torch.autograd.grad gives their '
            "gradients; sum the vector's over the ranks keeping this rank's slice. Return one"
            ' gradient per forward input: (grad_x, grad_shard, None)'
        )
