"""bf16 mixed precision, Megatron-LM's way: 16-bit parameters and activations,
32-bit gradients accumulated across microbatches, 32-bit master weights in the
optimizer.

Why three dtypes. A bf16 number keeps 8 bits of mantissa: about 2–3 decimal
digits. That is enough for the forward and backward computations (their errors
average out), but not for two kinds of sums:

* gradient accumulation over microbatches (and over data-parallel ranks): adding
  many small bf16 terms loses the small ones, so every parameter gets a float32
  ``main_grad`` and each microbatch's bf16 gradient is added into it the moment
  autograd has it (a post-accumulate hook; Megatron calls its buffer
  ``main_grad`` too). The data-parallel all-reduce, the sequence-parallel and
  the tied embedding's sums read and write ``main_grad`` (`grad_of`, `set_grad`);
* the update: lr·Adam's step is often below a bf16 weight's last digit, so a
  bf16 weight would not move. The optimizer steps a float32 *master* copy and
  the bf16 parameter is that copy rounded (`MixedPrecisionOptimizer`; under
  ZeRO-1 the master is the rank's float32 shard: `minitp.data_parallel`).

Bytes per parameter, then (Megatron-LM's distributed-optimizer table):
parameter 2 + main_grad 4 + master 4 + Adam's two moments 4 + 4 = 18. The ZeRO
paper's 16 accumulates gradients in 16 bits (2 + 2 + 12). `minitp.memory`
measures the 18 (`measure_model_states`), `minitp.calc` models both.

Under ZeRO stages 2 and 3 (`minitp.data_parallel.zero`) there is no whole-size ``main_grad``
(that would undo stage 2's saving): each unit's bf16 gradient is widened to
float32 as it is reduce-scattered, and its float32 shard *is* the master — the
optimizer steps it, and what is gathered into the bf16 parameters is its
rounding (the gather itself moves bf16, half the bytes).

What stays as it was: each microbatch's gradient is computed by autograd in
bf16 (Megatron can fuse the weight-gradient GEMM into the float32 buffer; here
the bf16 result is rounded once, then accumulated in float32), and the loss's
softmax runs in float32, chunk by chunk over tokens (`minitp.model.cross_entropy`, and the
vocab-parallel loss): never a float32 copy of the whole logits.
Only bfloat16: float16 would also need loss scaling (its exponent is too short
for small gradients), which minitp does not do.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .rules import model_chunks

MASTER_DTYPE = torch.float32


def dtype_name(dtype) -> str | None:
    """"bfloat16" for torch.bfloat16 (the rules in `minitp.rules` take names)."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def is_mixed(model: nn.Module) -> bool:
    """Whether `model` was made mixed precision by `mt.parallelize` (its stages are
    marked; at ZeRO stages 0-1 its parameters also carry ``main_grad``)."""
    chunks = model_chunks(model)
    return (any(c.mixed_precision for c in chunks)
            or has_main_grads(model.parameters()))


def has_main_grads(params) -> bool:
    """Whether these parameters' gradients live in float32 ``main_grad`` buffers."""
    return any(hasattr(p, "main_grad") for p in params)


def grad_of(p: nn.Parameter) -> torch.Tensor | None:
    """Where `p`'s gradient lives: its float32 ``main_grad`` under mixed precision,
    else ``.grad``."""
    return p.main_grad if hasattr(p, "main_grad") else p.grad


def set_grad(p: nn.Parameter, value: torch.Tensor) -> None:
    """Write `value` as `p`'s gradient, where `grad_of` reads it."""
    if hasattr(p, "main_grad"):
        p.main_grad.copy_(value.view_as(p.main_grad))
    elif p.grad is None:
        p.grad = value.view_as(p).clone()
    else:
        p.grad.copy_(value.view_as(p.grad))


def _accumulate(p: nn.Parameter) -> None:
    p.main_grad.add_(p.grad)  # float32 += bf16: the sum keeps float32's digits
    p.grad = None  # the bf16 gradient lived only until now


def attach_main_grads(modules) -> None:
    """Give every parameter of `modules` a float32 ``main_grad`` (zeros) that
    collects its gradient. Attach it before anything else that hooks the
    parameters' gradients (the data-parallel all-reduce): hooks run in the order
    they were registered, and those read ``main_grad``."""
    seen = set()
    for module in modules:
        for p in module.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            p.main_grad = torch.zeros_like(p, dtype=MASTER_DTYPE)
            p.register_post_accumulate_grad_hook(_accumulate)


def zero_main_grads(params) -> None:
    for p in params:
        p.grad = None
        if hasattr(p, "main_grad"):
            p.main_grad.zero_()


class MixedPrecisionOptimizer:
    """``optimizer_class`` over float32 master copies of bf16 parameters.

    ``step()``: each master takes its parameter's ``main_grad`` as its gradient,
    the inner optimizer steps the masters, and each parameter becomes its master
    rounded to bf16. The masters start as the bf16 parameters (widened), as
    Megatron-LM's do."""

    def __init__(self, params, optimizer_class, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [nn.Parameter(p.detach().to(MASTER_DTYPE)) for p in self.params]
        self.inner = optimizer_class(self.masters, **kwargs)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_main_grads(self.params)

    def step(self) -> None:
        for p, master in zip(self.params, self.masters, strict=True):
            master.grad = p.main_grad
        self.inner.step()
        with torch.no_grad():
            for p, master in zip(self.params, self.masters, strict=True):
                p.copy_(master)
                master.grad = None  # an alias of main_grad: not a second buffer to keep

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)
