"""The casts of an FP8 linear layer, and the layer's matmul made of them.

y = x Wᵀ takes three GEMMs, each fed FP8 operands. Two recipes, as their sources do them:

**tensorwise and delayed**: TransformerEngine's ``Format.HYBRID`` (its default, in
transformer_engine/common/recipe/__init__.py; torchao's tensorwise recipe casts the same
way): one scale a tensor, so each cast serves every GEMM that reads it:

* forward, y = x_q W_qᵀ: x_q and W_q in e4m3 (`cast_input`, the weight in `linear`);
* backward, input gradient ("dgrad"), ∂x = g_q W_q: g_q the output gradient in e5m2, W_q
  the forward's e4m3 weight;
* backward, weight gradient ("wgrad"), ∂W = g_qᵀ x_q: g_q in e5m2, x_q the forward's e4m3
  input (saved by autograd as the forward's input: the 8-bit copy, as TransformerEngine
  keeps it).

Each of these casts is an autograd Function with one job. A forward cast passes its
gradient through unchanged (backward: the identity, the straight-through rule every FP8
recipe uses: the gradient reaches the high-precision master weight as if the cast were not
there); the gradient cast does nothing forward and casts the output gradient backward.
autograd then computes the GEMMs above from the cast operands.

**rowwise**: torchao's ``ROWWISE`` recipe (torchao/float8/config.py; torchtitan's
``--float8.recipe_name rowwise``): e4m3 for every operand, gradients included, each scale a
power of two, one scale per row of an operand *as its GEMM reads it*. A scaled GEMM
(``torch._scaled_mm``) multiplies each output element by its two operands' scales, so a
scale must be constant along the dimension the GEMM sums over: a scale per token fits the
forward (it sums over features) but not wgrad (it sums over tokens). So the backward casts
again, from the high-precision tensors the forward kept, along the other axis, as torchao's
``matmul_with_hp_or_float8_args.backward`` does (torchao/float8/float8_linear.py):

* forward, y = x_r W_rᵀ: x and W scaled per row (per token; per output feature);
* dgrad, ∂x = g_r W_c: g per token, W per column (the ``weight_dgrad`` cast);
* wgrad, ∂W = g_cᵀ x_c: g and x per feature, the amax over the tokens (``grad_wgrad``,
  ``input_wgrad``).

`_RowwiseLinear` is that Function. Its forward casts x after any all-gather (torchtitan
gathers a rowwise run's sequence-parallel input in high precision), so `cast_input` passes x
through. **mxfp8, nvfp4**: Blackwell's block scales (`minitp.fp8.blocks`) take the same Function:
a scale a block along each GEMM's reduction dimension, so the backward casts again along the
other axis, as TransformerEngine's MXFP8BlockScaling keeps a rowwise and a columnwise copy
(transformer_engine/common/recipe/__init__.py) and torchao's MX training casts ``grad.t()``.

Everything else stays in the run's dtype, under every recipe: the bias and its
gradient (from the output gradient before its cast, as TransformerEngine's fused dbias),
and every module that is not a block's linear layer (`minitp.fp8.convert`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..rules.fp8_groups import RECASTS, ROLES, recasts, roles
from .blocks import ELEMENTS
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


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


class _RowwiseLinear(torch.autograd.Function):
    """y = x_r W_rᵀ, and a backward that casts x, W and g again along the axis each of its
    GEMMs keeps (torchao's matmul_with_hp_or_float8_args). `store`: a zero-bubble
    pipeline's `DeferredWeightGrads` (`minitp.tensor_parallel.weight_grad`), which takes
    wgrad's two casts to multiply later; then the weight comes in detached, and `param`
    (a tuple: autograd must not see it) is the parameter its gradient belongs to."""

    @staticmethod
    def forward(ctx, x, weight, scales: LayerScales, store, param):
        ctx.save_for_backward(x, weight)  # high precision: the backward casts them again
        ctx.scales, ctx.store, ctx.param = scales, store, param
        return F.linear(scales.input.cast(x), scales.weight.cast(weight))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        s = ctx.scales
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:  # dgrad sums over the output features
            grad_x = s.grad.cast(grad).matmul(s.weight_dgrad.cast(weight))
        g_c, x_c = s.grad_wgrad.cast(grad), s.input_wgrad.cast(x)  # wgrad sums over tokens
        if ctx.store is not None:
            ctx.store.add(ctx.param[0], x_c, g_c)
        elif ctx.needs_input_grad[1]:
            grad_weight = _rows(g_c).t().mm(_rows(x_c))
        return grad_x, grad_weight, None, None, None


class LayerScales:
    """One linear layer's scales, each a `TensorScale` that knows the axes its amax is
    reduced over: ``input``, ``weight``, ``grad`` (its output gradient), and under rowwise
    the backward's re-casts ``weight_dgrad``, ``input_wgrad``, ``grad_wgrad``.

    ``axes``: role -> the `Axis` objects to MAX-reduce over (`minitp.fp8.apply` takes them
    from the rule `minitp.rules.fp8_groups`; one process: none)."""

    def __init__(self, scaling: str, axes: dict | None = None,
                 history_len: int = DEFAULT_HISTORY, name: str = ""):
        axes = axes or {}
        rowwise = recasts(scaling)  # rowwise, mxfp8, nvfp4: scaled along each GEMM's sum
        fmt = ELEMENTS.get(scaling, E4M3)  # MXFP8, NVFP4: one element format for all
        grad_format = fmt if rowwise else E5M2  # torchao's ROWWISE and MX; TE's HYBRID

        def scale(role):
            return TensorScale(scaling, grad_format if role.startswith("grad") else fmt,
                               axes.get(role, ()), history_len, f"{name} {role}".strip(),
                               along="column" if role in RECASTS else "row",
                               power_of_2=scaling == "rowwise")

        self.scaling, self.name = scaling, name
        self.scales = {role: scale(role) for role in roles(scaling)}
        self.input, self.weight, self.grad = (self.scales[role] for role in ROLES)
        if rowwise:
            self.weight_dgrad, self.input_wgrad, self.grad_wgrad = (self.scales[role]
                                                                    for role in RECASTS)

    def cast_input(self, x: torch.Tensor) -> torch.Tensor:
        """x in e4m3 (its gradient unchanged): the layer calls it where its cast belongs
        (a column-parallel layer under SP: before the all-gather). Rowwise: x as it is, cast
        in `linear` (after the all-gather, from which its backward casts again)."""
        if recasts(self.scaling):
            return x
        return _CastForward.apply(x, self.input, torch.is_grad_enabled())

    def linear(self, x, weight, bias, gemm, layer=None) -> torch.Tensor:
        """``gemm(x, W_q, None[, layer])`` (x already cast), its output gradient cast to
        e5m2, then the bias in the run's dtype; rowwise: `_RowwiseLinear`, a zero-bubble
        pipeline's deferred weight gradient honoured (``layer.weight_grads``)."""
        if recasts(self.scaling):
            store = getattr(layer, "weight_grads", None)
            y = (_RowwiseLinear.apply(x, weight, self, None, None) if store is None else
                 _RowwiseLinear.apply(x, weight.detach(), self, store, (weight,)))
        else:
            w = _CastForward.apply(weight, self.weight, torch.is_grad_enabled())
            out = gemm(x, w, None) if layer is None else gemm(x, w, None, layer)
            y = _CastGrad.apply(out, self.grad)
        return y if bias is None else y + bias

    def __repr__(self) -> str:
        return "\n".join(repr(s) for s in self.scales.values())
