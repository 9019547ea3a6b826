"""The three casts of an FP8 linear layer, and the layer's matmul made of them.

y = x Wᵀ takes three GEMMs, each fed FP8 operands (TransformerEngine's HYBRID format):

* forward, y = x_q W_qᵀ: x_q and W_q in e4m3 (`cast_input`, the weight in `linear`);
* backward, input gradient ("dgrad"), ∂x = g_q W_q: g_q the output gradient in e5m2, W_q
  the forward's e4m3 weight;
* backward, weight gradient ("wgrad"), ∂W = g_qᵀ x_q: g_q in e5m2, x_q the forward's e4m3
  input (saved by autograd as the forward's input: the 8-bit copy, as TransformerEngine
  keeps it).

Each cast is an autograd Function with one job. A forward cast passes its gradient through
unchanged (backward: the identity, the straight-through rule every FP8 recipe uses: the
gradient reaches the high-precision master weight as if the cast were not there); the
gradient cast does nothing forward and casts the output gradient backward. autograd then
computes the GEMMs above from the cast operands. Everything else stays in the run's dtype:
the bias and its gradient (from the output gradient before its cast, as TransformerEngine's
fused dbias), and every module that is not a block's linear layer (`minitp.fp8.convert`).
"""

from __future__ import annotations

import torch

from ..rules.fp8_groups import ROLES
from .formats import E4M3, E5M2
from .scaling import DEFAULT_HISTORY, TensorScale


class _CastForward(torch.autograd.Function):
    """fwd: x cast to e4m3 with its scale (and read back) · bwd: the gradient as it is."""

    @staticmethod
    def forward(ctx, x, scale: TensorScale, record: bool):
        return scale.cast(x, record)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _CastGrad(torch.autograd.Function):
    """fwd: y as it is · bwd: the output gradient cast to e5m2 with its scale."""

    @staticmethod
    def forward(ctx, y, scale: TensorScale):
        ctx.scale = scale
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return ctx.scale.cast(grad), None


class LayerScales:
    """One linear layer's three scales — ``input``, ``weight``, ``grad`` (its output
    gradient) — each a `TensorScale` that knows the axes its amax is reduced over.

    ``axes``: role -> the `Axis` objects to MAX-reduce over (`minitp.fp8.apply` takes them
    from the rule `minitp.rules.fp8_groups`; one process: none)."""

    def __init__(self, scaling: str, axes: dict | None = None,
                 history_len: int = DEFAULT_HISTORY, name: str = ""):
        axes = axes or {}
        formats = {"input": E4M3, "weight": E4M3, "grad": E5M2}
        self.scaling, self.name = scaling, name
        self.scales = {role: TensorScale(scaling, formats[role], axes.get(role, ()),
                                         history_len, f"{name} {role}".strip())
                       for role in ROLES}
        self.input, self.weight, self.grad = (self.scales[role] for role in ROLES)

    def cast_input(self, x: torch.Tensor) -> torch.Tensor:
        """x in e4m3 (its gradient unchanged): the layer calls it where its cast belongs
        (a column-parallel layer under SP: before the all-gather)."""
        return _CastForward.apply(x, self.input, torch.is_grad_enabled())

    def linear(self, x, weight, bias, gemm, *gemm_args) -> torch.Tensor:
        """``gemm(x, W_q, None, *gemm_args)`` (x already cast), its output gradient cast to
        e5m2, then the bias in the run's dtype."""
        w = _CastForward.apply(weight, self.weight, torch.is_grad_enabled())
        y = _CastGrad.apply(gemm(x, w, None, *gemm_args), self.grad)
        return y if bias is None else y + bias

    def __repr__(self) -> str:
        return "\n".join(repr(s) for s in self.scales.values())
