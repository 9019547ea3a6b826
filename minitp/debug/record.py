"""Forward and backward hooks that record what every module of a model computed, in float64.

A `Recorder` hooks every module it is given under the plain GPT's name for it. Forward: each
call's output tensors (``output``, or ``output[i]`` for a tuple: RoPE's q and k, the router's
choices, gates and scores). Backward (`register_full_backward_hook`): each call's gradients
with respect to the module's own inputs (``grad_input[i]``): what the module's backward
computed, not the gradient it was handed (that is the next module's result). Each name also
gets its place in the order the hooks first fired, forward and backward: the order
`minitp.debug.first_divergence` reads the results in.

A forward that runs inside backward (activation recomputation re-running a layer) is not
recorded: it recomputes the forward already recorded. Every tensor is copied (detached, in
float64), so later in-place updates cannot change what was recorded.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from ..model.moe import Experts
from ..pipeline.stages import Skipped
from ..rules import model_chunks
from ..sharding.dense import dense_name

PHASES = ("forward", "backward")


def _tensors(values, prefix: str) -> list[tuple[str, torch.Tensor | None]]:
    """(label, tensor) of a module's output or its input gradients: one tensor, or a tuple."""
    if torch.is_tensor(values):
        return [(prefix, values)]
    if isinstance(values, (tuple, list)):
        return [(f"{prefix}[{i}]", v if torch.is_tensor(v) else None)
                for i, v in enumerate(values)]
    return []


def _copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64, copy=True)


class Recorder:
    """Every call's outputs and input gradients of `modules` ((plain name, module) pairs)."""

    def __init__(self, modules):
        self.calls = {phase: {} for phase in PHASES}  # name -> [ {label: tensor}, ... ]
        self.order = {phase: [] for phase in PHASES}  # names, in first-firing order
        self.modules = {}
        self._handles = []
        for name, module in modules:
            if name in self.modules:  # a wrapper and its module (`Recomputed`): the outer one
                continue
            self.modules[name] = module
            self._handles += [module.register_forward_hook(partial(self._forward, name)),
                              module.register_full_backward_hook(partial(self._backward, name))]

    def _keep(self, phase: str, name: str, labelled) -> None:
        if name not in self.calls[phase]:
            self.calls[phase][name] = []
            self.order[phase].append(name)
        self.calls[phase][name].append({label: _copy(t) for label, t in labelled
                                        if t is not None})

    def _forward(self, name, module, inputs, output):
        if torch._C._current_graph_task_id() != -1:  # a recomputation inside backward
            return
        self._keep("forward", name, _tensors(output, "output"))

    def _backward(self, name, module, grad_input, grad_output):
        self._keep("backward", name, _tensors(grad_input, "grad_input"))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def plain_modules(model: nn.Module):
    """(name, module) of the plain GPT's modules that are compared (not the root itself)."""
    return [(name, m) for name, m in model.named_modules() if name and not isinstance(m, Experts)]


def rank_modules(model: nn.Module):
    """(plain name, module) of this rank's parallel model: every pipeline chunk's modules
    under the plain GPT's names (`minitp.sharding.dense.dense_name`), leaving out the
    pass-throughs a stage holds for pieces that run elsewhere (`Skipped`) and what they hold,
    and the routed experts, whose rows are grouped by expert in an order the split decides."""
    out = []
    for chunk in model_chunks(model):
        skipped = [name for name, m in chunk.named_modules() if isinstance(m, Skipped)]
        for name, m in chunk.named_modules():
            if not name or isinstance(m, Experts):
                continue
            if any(name == s or name.startswith(s + ".") for s in skipped):
                continue
            out.append((dense_name(name, chunk.layer_offset), m))
    return out
