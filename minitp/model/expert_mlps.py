"""The experts' MLPs over rows grouped by expert, as one autograd Function.

Each expert e runs y = gelu(x W1[e] + b1[e]) W2[e] + b2[e] on its contiguous run of rows.
Written with plain autograd (``x_e @ W1[e]`` per expert), the backward of each indexing
``W1[e]`` allocates a zero tensor the size of the whole (E, …) stack and adds one expert's
gradient into it: E stacks for E experts, work and memory that grow as E². This Function
writes each expert's gradient straight into its slice of one gradient per stack, and
computes the same products autograd would (`tests/expert_parallel/test_moe.py` checks the
gradients against the plain-autograd loop). It keeps the rows and the pre-activations
for backward, and recomputes the GELU there (autograd would keep its output too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _ExpertMLPs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, counts, fc_w, fc_b, proj_w, proj_b):
        out = x.new_empty(x.shape[0], proj_w.shape[-1])
        hs = []
        for e, (rows, oe) in enumerate(zip(x.split(counts), out.split(counts), strict=True)):
            he = x.new_empty(rows.shape[0], fc_w.shape[-1])
            _linear(rows, fc_w[e], None if fc_b is None else fc_b[e], he)
            _linear(F.gelu(he), proj_w[e], None if proj_b is None else proj_b[e], oe)
            hs.append(he)
        ctx.save_for_backward(x, fc_w, proj_w)
        # One pre-activation per expert, each dropped once its backward is done (a plain
        # loop's autograd frees them so too): the weight gradients, allocated whole at the
        # start of backward, never sit beside all the activations.
        ctx.hs, ctx.counts = hs, counts
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, fc_w, proj_w = ctx.saved_tensors
        counts, hs = ctx.counts, ctx.hs
        if any(he is None for he in hs):
            raise RuntimeError("the experts' backward ran twice: minitp.model.expert_mlps "
                               "frees its activations as it goes, so it cannot be run with "
                               "retain_graph")
        need_x, _, need_fc, need_fc_b, need_proj, need_proj_b = ctx.needs_input_grad
        g_x = torch.empty_like(x) if need_x else None
        g_fc = torch.empty_like(fc_w) if need_fc else None
        g_proj = torch.empty_like(proj_w) if need_proj else None
        g_fc_b = fc_w.new_empty(fc_w.shape[0], fc_w.shape[2]) if need_fc_b else None
        g_proj_b = proj_w.new_empty(proj_w.shape[0], proj_w.shape[2]) if need_proj_b else None
        g_rows = g_x.split(counts) if need_x else [None] * len(counts)
        for e, (rows, ge, g_rows_e) in enumerate(zip(x.split(counts), grad.split(counts),
                                                     g_rows, strict=True)):
            he, hs[e] = hs[e], None
            if need_proj:
                torch.mm(F.gelu(he).t(), ge, out=g_proj[e])
            if need_proj_b:
                g_proj_b[e] = ge.sum(0)
            dh = torch.ops.aten.gelu_backward(ge.mm(proj_w[e].t()), he)
            if need_fc:
                torch.mm(rows.t(), dh, out=g_fc[e])
            if need_fc_b:
                g_fc_b[e] = dh.sum(0)
            if need_x:
                torch.mm(dh, fc_w[e].t(), out=g_rows_e)
            del he, dh
        return g_x, None, g_fc, g_fc_b, g_proj, g_proj_b


def _linear(x, w, b, out) -> None:
    """out = x w (+ b), the bias added by the matmul itself (addmm), as nn.Linear does."""
    if b is None:
        torch.mm(x, w, out=out)
    else:
        torch.addmm(b, x, w, out=out)


def expert_mlps(x, counts: list[int], fc_w, fc_b, proj_w, proj_b) -> torch.Tensor:
    """x (A, C), rows grouped by expert (``counts[e]`` for expert e) -> (A, C)."""
    return _ExpertMLPs.apply(x, counts, fc_w, fc_b, proj_w, proj_b)
