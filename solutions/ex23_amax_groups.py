"""Exercise 23: the amax groups of a tensor-parallel FP8 MLP, with and without sequence
parallelism — which ranks must agree on each scale, and when each scale is taken.

An FP8 linear layer y = x Wᵀ casts three tensors. In the classic recipe, used here
(TransformerEngine's Format.HYBRID; torchao's tensorwise), its input x and its weight W go to
e4m3 in the forward, its output gradient ∂y to e5m2 in the backward. Each cast multiplies the
tensor by a *scale*, max/amax, so that the tensor's largest magnitude (its amax) lands on
the format's largest value (448 for e4m3, 57344 for e5m2), and reads it back divided by
the same scale (`quantize`, given). A scale is meant for one tensor. When the mesh splits
that tensor over ranks, each rank holds a piece, and the piece's own amax would give each
rank its own scale: the ranks would round one tensor differently from one another and from
one device. So every rank's amax is all-reduced with MAX over the axes that split the
tensor — and only those: over an axis that holds copies the reduction changes nothing.

The mesh here is dp × tp. The MLP is Megatron's: a column-parallel layer (W₁ split by its
output rows over tp), GELU, a row-parallel layer (W₂ split by its input columns over tp).
Each data-parallel rank holds its own rows of the batch. With sequence parallelism the
column layer's input arrives as this rank's 1/tp of the sequence and is cast *before* its
all-gather (so the gather could move 8 bits: TransformerEngine does this, its PR #74), and
the row layer's output is reduce-scattered; its output gradient comes back all-gathered,
whole on every tp rank, before its cast. One thing differs from lesson 23's table: the
weights are ZeRO-3's (lesson 21). Each dp rank keeps 1/dp of its tp shard's rows, casts
that piece to e4m3, and all-gathers the casts over dp before the GEMM, so the gather moves
8 bits (torchao's float8 all-gather for FSDP); the weight's gradient is reduce-scattered
back over dp.

Your parts:

* (a) `shared_amax(t, axes)`: this rank's amax of `t` (the largest |value|), MAX-reduced
  over each `mt.Axis` in `axes` (none: the rank's own);
* (b) `amax_groups(layer, sequence_parallel)`: for "column" or "row", the names of the axes
  ("dp", "tp") each cast's amax is reduced over *in this layout*, by role: "input",
  "weight", "grad" (the output gradient). `mt.fp8.amax_table` prints a layout whose weights
  are whole on every dp rank; reason out, for each tensor as its cast sees it here, which
  axes hold other pieces of it. A group must contain all of those; one that also spans
  axes holding only copies is correct too (the same scales), at a cost the grader prices;
* (c) `gradient_gemms`, which `FP8Linear.backward` calls: the output gradient cast to e5m2
  with its shared scale, and the backward's two GEMMs from FP8 operands: ∂x = g_q W_q and
  ∂W = g_qᵀ x_q (x_q and W_q are the forward's casts, saved).

What you may need: ``mt.comm.all_reduce(t, axis, op="max")``; ``t.abs().max()``.

Grade it with `mt.grade("ex23")` in a notebook or `python -m minitp.course.grade ex23`: on
4 ranks (dp = 2, tp = 2), (a) over dp, tp and both; (b) for both layers with and without
SP, any correct group accepted; (c) with the grader's (a) and (b) in place, one forward and
backward of the MLP in float64 against one device's FP8 step on the whole batch; (d) all
three of yours together.
"""

import torch
import torch.nn.functional as F

import minitp as mt

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantize(t: torch.Tensor, amax: torch.Tensor, dtype) -> torch.Tensor:
    """`t` cast to the FP8 `dtype` with the scale that puts `amax` on the format's largest
    value, and read back in t's own dtype: the numbers an FP8 GEMM multiplies."""
    largest = torch.finfo(dtype).max
    scale = largest / amax.clamp(min=1e-30)
    return (t * scale).clamp(-largest, largest).to(dtype).to(t.dtype) / scale


def shared_amax(t: torch.Tensor, axes) -> torch.Tensor:
    """The largest |value| of the whole tensor `t` is a piece of: this rank's, MAX-reduced
    over every axis in `axes`."""
    # BEGIN SOLUTION
    # hint: an amax is a magnitude; and which reduction does all_reduce do unless told?
    amax = t.detach().abs().max()
    for axis in axes:
        amax = mt.comm.all_reduce(amax, axis, op="max")
    return amax
    # END SOLUTION


def amax_groups(layer: str, sequence_parallel: bool) -> dict:
    """role ("input", "weight", "grad") -> the axis names ("dp", "tp") its amax is reduced
    over, for the "column" or "row" layer of the MLP."""
    # BEGIN SOLUTION
    # hint: for each tensor as its cast sees it, which axes hold other pieces of it? Here
    # hint: a weight is cast before ZeRO-3's gather: what does each dp rank hold of it?
    split_input = layer == "row" or sequence_parallel  # the features, or the sequence shard
    return {"input": ("dp", "tp") if split_input else ("dp",),
            "weight": ("dp", "tp"),
            "grad": ("dp", "tp") if layer == "column" else ("dp",)}
    # END SOLUTION


class FP8Linear(torch.autograd.Function):
    """y = x Wᵀ from FP8 operands, W this rank's ZeRO-3 piece (1/dp of the rows) of its
    shard of a "column" or "row" layer, with its tensor-parallel communication (and SP's,
    when `sequence_parallel`) and ZeRO-3's over dp."""

    @staticmethod
    def forward(ctx, x, w, layer, mesh, sequence_parallel):
        groups = amax_groups(layer, sequence_parallel)
        ctx.axes = {role: tuple(getattr(mesh, name) for name in names)
                    for role, names in groups.items()}
        xq = quantize(x, shared_amax(x, ctx.axes["input"]), E4M3)
        wq = quantize(w, shared_amax(w, ctx.axes["weight"]), E4M3)
        wq = mt.comm.all_gather(wq, mesh.dp, dim=0)  # ZeRO-3's gather, of the 8-bit casts
        if layer == "column" and sequence_parallel:  # cast first, then gather the sequence
            xq = mt.comm.all_gather(xq, mesh.tp, dim=1)
        y = xq @ wq.T
        if layer == "row":  # every rank holds a partial sum of y
            y = (mt.comm.reduce_scatter(y, mesh.tp, dim=1) if sequence_parallel
                 else mt.comm.all_reduce(y, mesh.tp))
        ctx.save_for_backward(xq, wq)
        ctx.layer, ctx.mesh, ctx.sequence_parallel = layer, mesh, sequence_parallel
        return y

    @staticmethod
    def backward(ctx, grad):
        xq, wq = ctx.saved_tensors
        mesh = ctx.mesh
        if ctx.layer == "row" and ctx.sequence_parallel:  # the reduce-scatter's backward
            grad = mt.comm.all_gather(grad, mesh.tp, dim=1)
        dx, dw = gradient_gemms(grad, xq, wq, ctx.axes["grad"])
        if ctx.layer == "column":  # x was whole (or gathered): sum its gradient over tp
            dx = (mt.comm.reduce_scatter(dx, mesh.tp, dim=1) if ctx.sequence_parallel
                  else mt.comm.all_reduce(dx, mesh.tp))
        dw = mt.comm.reduce_scatter(dw, mesh.dp, dim=0)  # summed over dp, this rank's rows
        return dx, dw, None, None, None


def gradient_gemms(grad, xq, wq, axes):
    """The backward of y = x Wᵀ from FP8 operands: the output gradient `grad` cast to e5m2
    with the scale of the whole gradient (its amax shared over `axes`), then ∂x = g_q W_q
    and ∂W = g_qᵀ x_q (`xq`, `wq`: the forward's e4m3 casts). Returns (∂x, ∂W)."""
    # BEGIN SOLUTION
    # hint: the gradient has its own format, its own amax and its own group; then
    # hint: both GEMMs read FP8 operands only: which saved cast pairs with it in each?
    gq = quantize(grad, shared_amax(grad, axes), E5M2)
    dx = gq @ wq
    dw = gq.reshape(-1, gq.shape[-1]).T @ xq.reshape(-1, xq.shape[-1])
    return dx, dw
    # END SOLUTION


def mlp(x, w1, w2, mesh, sequence_parallel=False):
    """The tensor-parallel FP8 MLP: column layer, GELU, row layer. x: (B, T, C), or this
    rank's (B, T/tp, C) under SP; w1: (H/tp/dp, C); w2: (C/dp, H/tp): ZeRO-3's pieces."""
    h = FP8Linear.apply(x, w1, "column", mesh, sequence_parallel)
    return FP8Linear.apply(F.gelu(h), w2, "row", mesh, sequence_parallel)
