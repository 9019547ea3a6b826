"""Exercise 21: one ZeRO-3 unit — free the gathered parameters after the forward, and
refill them, in place, just before the backward needs them.

ZeRO stage 3 (Rajbhandari et al. 2020; FSDP is the same design) keeps no whole
parameters anywhere. A *unit* (a layer, a block) has Ψ_u parameter values,
flattened into one vector and padded with zeros to a multiple of N (the
data-parallel size); rank d keeps only the d-th of the N equal slices, its
*shard*, and the optimizer steps only that. Given below: the shard, and
`GatherParams`, whose forward all-gathers the shards into the whole vector and
whose backward reduce-scatters the vector's gradient (every rank's summed, each
rank keeping its own slice).

The module then runs on views of the whole vector, and autograd **saves** some of
those views for backward (a Linear keeps its weight to compute its input's
gradient). The activations stay (no recomputation here); the parameters must
not. Your part is their memory:

* **after the unit's forward**, the rank holds its shard and nothing more: the
  gathered vector's memory is gone, although autograd still holds views of it;
* **when backward reaches the unit** (before the first of its backward nodes
  reads a saved view), the vector is gathered again and its values are back
  where the saved views look, exactly the forward's values. Autograd counts
  every in-place write to a tensor it saved (its *version*) and refuses to use
  a saved tensor written since: a refill changes no value, so it must not count;
* **after the unit's backward** (every node that read the vector has run), the
  memory is gone again;
* so during backward a rank holds the parameters of one unit at a time, and each
  unit costs one all-gather in forward, one in backward and one reduce-scatter:
  the paper's 3Ψ against data parallelism's 2Ψ.

`minitp.data_parallel.zero_stage3` does the same for the whole GPT.

What you may need:

* ``t.untyped_storage()``: the memory under `t` and under every view of it;
  ``storage.resize_(nbytes)`` frees it (0) or allocates it again (same place
  for all the views, new, uninitialised bytes);
* ``t.data``: a tensor on the same storage that autograd does not watch;
* ``t.register_hook(fn)``: ``fn(grad)`` runs when the gradient of `t` has been
  computed, before it flows on to the nodes that made `t`;
* ``mt.comm.all_gather(shard, axis)``: every rank's shard, in rank order.

Grade it with `mt.grade("ex21")` in a notebook or `python -m minitp.course.grade ex21`:
two units in a row, two SGD steps on the shards, at dp = 2 and 3 in float64,
against the plain blocks on the whole batch; it measures the gathered vectors'
storage after each unit's forward, during backward and after it, and reads the
collectives from the trace. Then gradient accumulation: two micro-batches' forwards,
then their two backwards before one step (each backward refills its own forward's
vector; the shards' gradients must add up to the plain blocks').
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
        start = axis.rank * self.shard_size
        self.shard = nn.Parameter(flat[start:start + self.shard_size].clone())
        for p in module.parameters():  # the module keeps no values of its own now
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = GatherParams.apply(self.shard, self)  # (padded,): the whole vector
        y = run_module(self, full, x)  # autograd has saved views of `full` by now
        # BEGIN SOLUTION
        # hint: after the forward this rank holds its shard only; and the refill must run once
        # hint: backward reaches this unit, before any of its nodes: which gradient arrives then?
        free(full)
        if y.requires_grad:  # no backward coming (torch.no_grad()): nothing to refill
            y.register_hook(lambda grad: self.refill(full))
        return y
        # END SOLUTION

    def refill(self, full: torch.Tensor) -> None:
        """Gather the shards again, and put the whole vector back where the views of
        `full` that autograd saved will read it."""
        # BEGIN SOLUTION
        # hint: the saved views point into full's storage, not at a name: which memory must
        # hint: hold the values? And autograd checks the version of every tensor it saved
        values = mt.comm.all_gather(self.shard.detach(), self.axis)
        full.untyped_storage().resize_(values.numel() * values.element_size())
        full.data.copy_(values)  # through .data: no version bump, the values are the same
        # END SOLUTION


def free(full: torch.Tensor) -> None:
    """Give back the memory of the gathered vector `full`, though tensors that view it
    (autograd's saved ones among them) stay alive."""
    # BEGIN SOLUTION
    # hint: `del` only drops a name: autograd's saved views keep what they point to
    full.untyped_storage().resize_(0)
    # END SOLUTION


def run_module(unit: Zero3Unit, full: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The module's forward on `x`, its parameters views of the whole vector `full`."""
    views, offset = {}, 0
    for name, shape in zip(unit.names, unit.shapes, strict=True):
        views[name] = full[offset:offset + shape.numel()].view(shape)
        offset += shape.numel()
    return torch.func.functional_call(unit.module, views, (x,))


class GatherParams(torch.autograd.Function):
    """fwd: all-gather the shards into the whole vector · bwd: reduce-scatter its
    gradient, this rank keeping its shard's."""

    @staticmethod
    def forward(ctx, shard, unit):
        full = mt.comm.all_gather(shard.detach(), unit.axis)  # every rank's shard, in order
        ctx.unit = unit
        ctx.save_for_backward(full)  # backward gets the vector back from here
        return full

    @staticmethod
    def backward(ctx, grad_full):
        # BEGIN SOLUTION
        # hint: the vector's whole gradient is here, so every node that read the vector has
        # hint: run: what may this rank still hold?
        (full,) = ctx.saved_tensors
        free(full)
        # END SOLUTION
        return mt.comm.reduce_scatter(grad_full, ctx.unit.axis), None
