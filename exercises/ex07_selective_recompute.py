# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex07
# Made from solutions/ex07_selective_recompute.py by `python -m minitp.course.make_exercises`.
"""Exercise 07: selective activation recomputation of the attention core, by hand.

The attention core — scores = q·kᵀ/√d, causal mask, softmax, dropout, ·v — keeps
the s×s tensors that make up the 5as²b term of Korthikanti et al.'s activation
formula, yet costs few FLOPs. Selective recomputation keeps only its inputs
q, k, v and runs it again during the backward pass.

`RecomputedCore` is that, written as an autograd Function (what
``torch.utils.checkpoint`` does for you, and what `mt.parallelize(...,
recompute="selective")` uses):

* forward: run the core without recording a graph — so autograd keeps none of
  its intermediate tensors (a Function's forward already runs that way;
  ``torch.no_grad()`` says so explicitly) — and save only q, k, v, plus the
  state of the random generator, so that dropout can draw the *same* mask again;
* backward: put the generator back in that state, run the core again on
  detached copies of q, k, v with gradients enabled, restore the generator to
  where it was (so the rest of training draws what it would have drawn), and
  back-propagate the incoming gradient through the recomputed graph.

`SelectiveRecompute` wraps a core module with it; `recompute_attention_cores`
swaps it into every layer of a model. Grade it with `mt.grade("ex07")` in a
notebook or `python -m minitp.course.grade ex07`.
"""

import torch
import torch.nn as nn


class RecomputedCore(torch.autograd.Function):
    """fwd: core(q, k, v) keeping only q, k, v · bwd: recompute the core, then back-propagate."""

    @staticmethod
    def forward(ctx, core, q, k, v):  # q, k, v: (B, nh, T, hs)
        # hint: remember the core (ctx.core = core) and the random state (torch.get_rng_state());
        # hint: ctx.save_for_backward(q, k, v); then return core(q, k, v) computed inside
        # hint: `with torch.no_grad():` (no graph: nothing inside the core is kept)
        raise NotImplementedError(
            'remember the core (ctx.core = core) and the random state '
            '(torch.get_rng_state()); ctx.save_for_backward(q, k, v); then return core(q, k, '
            'v) computed inside `with torch.no_grad():` (no graph: nothing inside the core is'
            ' kept)'
        )

    @staticmethod
    def backward(ctx, grad_out):
        # hint: q, k, v = ctx.saved_tensors; inputs = [x.detach().requires_grad_() for each];
        # hint: now = torch.get_rng_state(); torch.set_rng_state(ctx.rng_state); run
        # hint: out = ctx.core(*inputs) inside `with torch.enable_grad():`;
        # hint: torch.set_rng_state(now); grads = torch.autograd.grad(out, inputs, grad_out);
        # hint: return (None, *grads): no gradient for the core argument
        raise NotImplementedError(
            'q, k, v = ctx.saved_tensors; inputs = [x.detach().requires_grad_() for each]; '
            'now = torch.get_rng_state(); torch.set_rng_state(ctx.rng_state); run out = '
            'ctx.core(*inputs) inside `with torch.enable_grad():`; torch.set_rng_state(now); '
            'grads = torch.autograd.grad(out, inputs, grad_out); return (None, *grads): no '
            'gradient for the core argument'
        )


class SelectiveRecompute(nn.Module):
    """Runs an attention core so that only its inputs are kept (in training)."""

    def __init__(self, core: nn.Module):
        super().__init__()
        self.core = core

    def forward(self, q, k, v):
        if not self.training:  # no backward will come: nothing to save, nothing to recompute
            return self.core(q, k, v)
        return RecomputedCore.apply(self.core, q, k, v)


def recompute_attention_cores(model: nn.Module) -> nn.Module:
    """Wrap every layer's attention core (``blocks[i].attn.core``) in place; returns `model`."""
    for block in model.blocks:
        block.attn.core = SelectiveRecompute(block.attn.core)
    return model
