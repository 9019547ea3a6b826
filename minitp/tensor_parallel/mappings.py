"""The conjugate pairs: autograd Functions whose backward is the adjoint of their forward.

Three tiers, as in Megatron-Core's ``tensor_parallel/mappings.py``:
tensor helpers (`minitp.runtime.comm`) → autograd Functions that only compose them →
lowercase wrappers that the layers call.

Why is the backward of a *copy* an all-reduce? Think of a replicated tensor x as
one vector that every rank reads. Copying it into n per-rank branches is the map
x ↦ (x, x, …, x); its adjoint takes the n branch gradients (g_0, …, g_n-1) to
their sum. Every pair below is such an adjoint pair, and `tests/tensor_parallel/test_mappings.py`
checks ⟨f(x), y⟩ = ⟨x, f*(y)⟩ with the inner product summed over ranks for
per-rank tensors and taken once for replicated ones.

One naming grammar, Megatron's: what the forward does, ``copy_to``, ``reduce_from``,
``scatter_to``, ``gather_from`` or ``reduce_scatter_to``, then the region it enters or
leaves. The ``_parallel`` region is tensor parallelism's, split along the hidden (last)
dimension; the ``_sequence`` region is sequence parallelism's, split along the sequence
(dim 1 of a (batch, seq, hidden) activation, `minitp.rules.SEQ_DIM`).
"""

from __future__ import annotations

import functools

import torch

from ..rules import SEQ_DIM
from ..runtime import comm, trace
from ..runtime.mesh import Axis


def _remember(ctx, axis: Axis) -> None:
    """Keep what backward needs: the axis, and the trace label the forward ran under."""
    ctx.axis = axis
    ctx.label = trace.recorder().label


def _split(x: torch.Tensor, axis: Axis, dim: int) -> torch.Tensor:
    """This rank's chunk of `x` along `dim` (no communication)."""
    size = x.shape[dim]
    if size % axis.size:
        raise ValueError(
            f"cannot split dimension {dim} of size {size} into {axis.size} equal parts "
            f"for axis {axis.name}"
        )
    return x.chunk(axis.size, dim=dim)[axis.rank].contiguous()


class _CopyToParallel(torch.autograd.Function):
    """f — fwd: identity (each rank uses the replicated input) · bwd: all-reduce the gradients."""

    @staticmethod
    def forward(ctx, x, axis):
        _remember(ctx, axis)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        with trace.relabel(ctx.label):  # backward runs after the forward's label ended
            return comm.all_reduce(grad, ctx.axis), None


class _ReduceFromParallel(torch.autograd.Function):
    """g — fwd: all-reduce the partial sums · bwd: identity (the gradient is replicated)."""

    @staticmethod
    def forward(ctx, x, axis):
        return comm.all_reduce(x, axis)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToParallel(torch.autograd.Function):
    """fwd: keep this rank's slice of the last dimension · bwd: all-gather the last dimension."""

    @staticmethod
    def forward(ctx, x, axis):
        _remember(ctx, axis)
        return _split(x, axis, -1)

    @staticmethod
    def backward(ctx, grad):
        with trace.relabel(ctx.label):  # backward runs after the forward's label ended
            return comm.all_gather(grad, ctx.axis, dim=-1), None


class _GatherFromParallel(torch.autograd.Function):
    """fwd: all-gather the last dimension · bwd: keep this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, x, axis):
        _remember(ctx, axis)
        return comm.all_gather(x, axis, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.axis, -1), None


class _ScatterToSequence(torch.autograd.Function):
    """fwd: keep this rank's slice of the sequence · bwd: all-gather the sequence."""

    @staticmethod
    def forward(ctx, x, axis):
        _remember(ctx, axis)
        return _split(x, axis, SEQ_DIM)

    @staticmethod
    def backward(ctx, grad):
        with trace.relabel(ctx.label):  # backward runs after the forward's label ended
            return comm.all_gather(grad, ctx.axis, dim=SEQ_DIM), None


class _GatherFromSequence(torch.autograd.Function):
    """fwd: all-gather the sequence · bwd: keep this rank's slice of the (replicated) gradient."""

    @staticmethod
    def forward(ctx, x, axis):
        _remember(ctx, axis)
        return comm.all_gather(x, axis, dim=SEQ_DIM)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.axis, SEQ_DIM), None


class _ReduceScatterToSequence(torch.autograd.Function):
    """fwd: reduce-scatter partial sums along the sequence · bwd: all-gather the sequence."""

    @staticmethod
    def forward(ctx, x, axis):
        _remember(ctx, axis)
        return comm.reduce_scatter(x, axis, dim=SEQ_DIM)

    @staticmethod
    def backward(ctx, grad):
        with trace.relabel(ctx.label):  # backward runs after the forward's label ended
            return comm.all_gather(grad, ctx.axis, dim=SEQ_DIM), None


class _AllGatherFromSequence(torch.autograd.Function):
    """fwd: all-gather the sequence · bwd: reduce-scatter the (partial) gradients along it.

    Sequence parallelism's entry to a column-parallel layer: every rank's branch
    contributes a partial gradient for the whole sequence, so the backward sums
    them and hands each rank its own slice.
    """

    @staticmethod
    def forward(ctx, x, axis):
        _remember(ctx, axis)
        return comm.all_gather(x, axis, dim=SEQ_DIM)

    @staticmethod
    def backward(ctx, grad):
        with trace.relabel(ctx.label):  # backward runs after the forward's label ended
            return comm.reduce_scatter(grad, ctx.axis, dim=SEQ_DIM), None


def _identity_on_one_rank(mapping):
    """Over an axis of one rank every mapping is the identity both ways (nothing to
    split, gather or sum), so its autograd Function is skipped: at world 1 that
    Python cost 5-8% of a small CPU training step (bench/gpt_step.py, parallelize
    against the plain GPT). No collective is lost: one-rank axes trace none."""
    @functools.wraps(mapping)
    def mapped(x, axis, *args, **kwargs):
        return x if axis.size == 1 else mapping(x, axis, *args, **kwargs)
    return mapped


# Lowercase wrappers: what layers call. Each pair is the other's adjoint.
@_identity_on_one_rank
def copy_to_parallel(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """f: identity forward, all-reduce backward. Adjoint of `reduce_from_parallel`."""
    with trace.forward_phase():
        return _CopyToParallel.apply(x, axis)


@_identity_on_one_rank
def reduce_from_parallel(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """g: all-reduce forward, identity backward. Adjoint of `copy_to_parallel`."""
    with trace.forward_phase():
        return _ReduceFromParallel.apply(x, axis)


@_identity_on_one_rank
def scatter_to_parallel(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """Slice forward, all-gather backward (last dim). Adjoint of `gather_from_parallel`."""
    with trace.forward_phase():
        return _ScatterToParallel.apply(x, axis)


@_identity_on_one_rank
def gather_from_parallel(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """All-gather forward, slice backward (last dim). Adjoint of `scatter_to_parallel`."""
    with trace.forward_phase():
        return _GatherFromParallel.apply(x, axis)


@_identity_on_one_rank
def scatter_to_sequence(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """Slice forward, all-gather backward (sequence dim). Adjoint of
    ``gather_from_sequence(grad_is_partial=False)``."""
    with trace.forward_phase():
        return _ScatterToSequence.apply(x, axis)


@_identity_on_one_rank
def gather_from_sequence(x: torch.Tensor, axis: Axis, *, grad_is_partial: bool) -> torch.Tensor:
    """All-gather forward (sequence dim). The backward depends on what the gradient
    arriving at the gathered tensor is — say which, as Megatron-Core's
    ``tensor_parallel_output_grad`` does:

    * ``grad_is_partial=False``: the same on every rank (replicated) — keep this
      rank's slice. Adjoint of `scatter_to_sequence`.
    * ``grad_is_partial=True``: one term of a sum on each rank (the input of a
      column-parallel layer, whose ranks each computed a partial gradient) —
      reduce-scatter: sum the terms, hand each rank its slice. Adjoint of
      `reduce_scatter_to_sequence`.
    """
    function = _AllGatherFromSequence if grad_is_partial else _GatherFromSequence
    with trace.forward_phase():
        return function.apply(x, axis)


@_identity_on_one_rank
def to_column_parallel(x: torch.Tensor, axis: Axis, sequence_parallel: bool) -> torch.Tensor:
    """What a column-parallel layer's input goes through: f (identity forward, all-reduce
    of the partial input gradients backward) or, with sequence parallelism, the all-gather
    of the sequence shards (reduce-scatter backward). Several layers reading one input
    share it: one collective, their gradients summed before it (`ParallelInput`)."""
    if sequence_parallel:
        return gather_from_sequence(x, axis, grad_is_partial=True)  # (B, T/t, C) -> (B, T, C)
    return copy_to_parallel(x, axis)


def reduce_scatter_to_sequence(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """Reduce-scatter forward, all-gather backward. Adjoint of
    ``gather_from_sequence(grad_is_partial=True)``."""
    with trace.forward_phase():
        return _ReduceScatterToSequence.apply(x, axis)


def _gather_replicated_grad(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    return gather_from_sequence(x, axis, grad_is_partial=False)


def _gather_partial_grad(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    return gather_from_sequence(x, axis, grad_is_partial=True)


# Each mapping (by the name a test or a trace reader knows it by), its adjoint, and
# what kind of tensor it takes and gives ("replicated": one value every rank holds;
# "per-rank": each rank its own).
PAIRS = {
    "copy_to_parallel": (copy_to_parallel, "reduce_from_parallel", "replicated", "per-rank"),
    "reduce_from_parallel": (reduce_from_parallel, "copy_to_parallel", "per-rank", "replicated"),
    "scatter_to_parallel": (scatter_to_parallel, "gather_from_parallel", "replicated", "per-rank"),
    "gather_from_parallel": (gather_from_parallel, "scatter_to_parallel", "per-rank", "replicated"),
    "scatter_to_sequence": (scatter_to_sequence, "gather_from_sequence", "replicated",
                            "per-rank"),
    "gather_from_sequence": (_gather_replicated_grad, "scatter_to_sequence", "per-rank",
                             "replicated"),
    "reduce_scatter_to_sequence": (reduce_scatter_to_sequence, "gather_from_sequence(partial)",
                                   "per-rank", "per-rank"),
    "gather_from_sequence(partial)": (_gather_partial_grad, "reduce_scatter_to_sequence",
                                      "per-rank", "per-rank"),
}
