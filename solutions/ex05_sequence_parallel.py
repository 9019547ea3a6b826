"""Exercise 05: sequence parallelism's conjugate pair, and the partial-gradient sum.

With sequence parallelism, the activations between tensor-parallel regions are
split along the sequence (dim 1 of a (batch, seq, hidden) tensor): rank r holds
positions [r·T/t, (r+1)·T/t). Two autograd Functions replace f and g:

* `AllGatherFromSequence` (entering a column-parallel layer, in place of f):
  fwd: all-gather the sequence shards, so every rank has the whole sequence ·
  bwd: reduce-scatter — every rank's branch made a gradient for the WHOLE
  sequence; sum them and keep your own positions.
* `ReduceScatterToSequence` (leaving a row-parallel layer, in place of g):
  fwd: reduce-scatter the partial sums, each rank keeping its positions ·
  bwd: all-gather — the gradient of your positions is all you hold; the
  partial products need it for the whole sequence.

Each is the other's adjoint, and reduce-scatter + all-gather moves the same
bytes as the all-reduce it replaces.

Parameters that act on sequence shards — LayerNorm weights and biases, the
row-parallel layers' biases, the position embedding — are replicated, but each
rank's gradient covers only its own positions: `sync_partial_grads` must sum
them over the tensor-parallel group before the optimizer step.

Use `mt.comm.all_gather(x, axis, dim=1)` and `mt.comm.reduce_scatter(x, axis, dim=1)`
for the pair, and `mt.comm.all_reduce(x, axis)` for the sum.
Grade it with `mt.grade("ex05")` in a notebook or `python -m minitp.course.grade ex05`.
"""

import torch

import minitp as mt

SEQ_DIM = 1  # activations are (batch, seq, hidden)


class AllGatherFromSequence(torch.autograd.Function):
    """fwd: all-gather the sequence · bwd: reduce-scatter the gradients along it."""

    @staticmethod
    def forward(ctx, x, axis):  # x: (B, T/t, h), this rank's positions
        ctx.axis = axis
        # BEGIN SOLUTION
        # hint: every rank needs the whole sequence: mt.comm.all_gather along SEQ_DIM
        return mt.comm.all_gather(x, axis, dim=SEQ_DIM)  # (B, T, h)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):  # grad: (B, T, h), this rank's branch's gradient, whole sequence
        # BEGIN SOLUTION
        # hint: sum the ranks' gradients and keep this rank's positions: mt.comm.reduce_scatter
        # hint: along SEQ_DIM. Return one gradient per forward input: (grad_x, None)
        return mt.comm.reduce_scatter(grad, ctx.axis, dim=SEQ_DIM), None  # (B, T/t, h)
        # END SOLUTION


class ReduceScatterToSequence(torch.autograd.Function):
    """fwd: reduce-scatter partial sums along the sequence · bwd: all-gather the sequence."""

    @staticmethod
    def forward(ctx, x, axis):  # x: (B, T, h), this rank's partial sum for the whole sequence
        ctx.axis = axis
        # BEGIN SOLUTION
        # hint: sum the partial results over the ranks, each keeping its own positions
        return mt.comm.reduce_scatter(x, axis, dim=SEQ_DIM)  # (B, T/t, h)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):  # grad: (B, T/t, h), for this rank's positions
        # BEGIN SOLUTION
        # hint: the partial sums were made for the whole sequence, so their gradient is the
        # hint: whole sequence's: all-gather along SEQ_DIM. Return (grad_x, None)
        return mt.comm.all_gather(grad, ctx.axis, dim=SEQ_DIM), None  # (B, T, h)
        # END SOLUTION


def all_gather_from_sequence(x, axis):
    return AllGatherFromSequence.apply(x, axis)


def reduce_scatter_to_sequence(x, axis):
    return ReduceScatterToSequence.apply(x, axis)


def sync_partial_grads(params, axis) -> None:
    """Sum each parameter's .grad over the ranks of `axis`, in place.

    One all-reduce for all of them (flattened into one tensor) costs one
    latency instead of one per parameter; several all-reduces are also correct.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    # BEGIN SOLUTION
    # hint: flatten them into one tensor (torch.cat of g.reshape(-1)), sum it over the
    # hint: ranks with mt.comm.all_reduce(flat, axis), then copy each piece back in place:
    # hint: for g, piece in zip(grads, total.split(sizes)): g.copy_(piece.view_as(g))
    flat = torch.cat([g.reshape(-1) for g in grads])
    total = mt.comm.all_reduce(flat, axis)
    for g, piece in zip(grads, total.split([g.numel() for g in grads]), strict=True):
        g.copy_(piece.view_as(g))
    # END SOLUTION
