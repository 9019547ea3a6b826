# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex02
# Made from solutions/ex02_column_row_parallel.py by `python -m minitp.course.make_exercises`.
"""Exercise 02: Megatron's f and g, and the column- and row-parallel linear layers.

A linear layer computes Y = XA + b. With t tensor-parallel ranks (the ranks of
`axis`), rank r holds one block of the weight:

* column-parallel: A = [A_0 … A_{t-1}] split by columns (and b with it). Every
  rank has all of X and computes its own slice of the output, Y_r = X A_r + b_r.
  X enters through **f**: identity forward (every rank already holds X), and
  all-reduce backward (each rank's branch sends back only a part of dL/dX).
* row-parallel: A = [A_0; …; A_{t-1}] split by rows, and X = [X_0 … X_{t-1}]
  by columns. Rank r holds X_r and computes the partial product X_r A_r; **g**
  adds them up: all-reduce forward, identity backward (every rank's term
  receives the same, replicated, dL/dY). The bias b is whole on every rank and is
  added once, after the sum.

Weights follow `torch.nn.Linear`: ``weight`` is (d_out, d_in), that is Aᵀ, so a
column block of A is a block of weight *rows*. The shards you receive:

    column_parallel_linear: weight (d_out/t, d_in), bias (d_out/t,)
    row_parallel_linear:    weight (d_out, d_in/t), bias (d_out,), the whole bias

Write f and g as ``torch.autograd.Function`` s with ``mt.comm.all_reduce(tensor,
axis)`` (it returns the sum over the ranks of `axis`), then the two layers with
``F.linear`` and f / g. Grade with `mt.grade("ex02")` in a notebook or
`python -m minitp.course.grade ex02`.
"""

import torch
import torch.nn.functional as F

import minitp as mt


class CopyToParallel(torch.autograd.Function):
    """f — forward: identity · backward: all-reduce the gradient over `axis`."""

    @staticmethod
    def forward(ctx, x, axis):
        # hint: every rank already holds all of x: return it unchanged (x.view_as(x)), and
        # hint: keep the axis for the backward pass (ctx.axis = axis)
        raise NotImplementedError(
            'every rank already holds all of x: return it unchanged (x.view_as(x)), and keep '
            'the axis for the backward pass (ctx.axis = axis)'
        )

    @staticmethod
    def backward(ctx, grad):
        # hint: each rank's branch holds only its part of dL/dx: sum them with
        # hint: mt.comm.all_reduce(grad, ctx.axis). Return one gradient per forward input:
        # hint: (gradient for x, None for axis)
        raise NotImplementedError(
            "each rank's branch holds only its part of dL/dx: sum them with "
            'mt.comm.all_reduce(grad, ctx.axis). Return one gradient per forward input: '
            '(gradient for x, None for axis)'
        )


class ReduceFromParallel(torch.autograd.Function):
    """g — forward: all-reduce (sum the ranks' partial results) · backward: identity."""

    @staticmethod
    def forward(ctx, x, axis):
        # hint: return the sum of every rank's x: mt.comm.all_reduce(x, axis)
        raise NotImplementedError(
            "return the sum of every rank's x: mt.comm.all_reduce(x, axis)"
        )

    @staticmethod
    def backward(ctx, grad):
        # hint: dY/dX_r is the identity for every term of a sum, and grad is already the
        # hint: same on every rank: pass it through unchanged (grad, None). No communication.
        raise NotImplementedError(
            'dY/dX_r is the identity for every term of a sum, and grad is already the same on'
            ' every rank: pass it through unchanged (grad, None). No communication.'
        )


def copy_to_parallel(x: torch.Tensor, axis: mt.Axis) -> torch.Tensor:
    """f: identity forward, all-reduce backward."""
    return CopyToParallel.apply(x, axis)


def reduce_from_parallel(x: torch.Tensor, axis: mt.Axis) -> torch.Tensor:
    """g: all-reduce forward, identity backward."""
    return ReduceFromParallel.apply(x, axis)


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                           axis: mt.Axis) -> torch.Tensor:
    """Y_r = X A_r + b_r: x (..., d_in) the same on every rank -> (..., d_out/t)."""
    # hint: pass x through f (copy_to_parallel), then F.linear(x, weight, bias)
    raise NotImplementedError(
        'pass x through f (copy_to_parallel), then F.linear(x, weight, bias)'
    )


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        axis: mt.Axis) -> torch.Tensor:
    """Y = Σ_r X_r A_r + b: x (..., d_in/t) this rank's slice -> (..., d_out) on every rank."""
    # hint: this rank's partial product F.linear(x, weight) (no bias yet), summed over the
    # hint: ranks by g (reduce_from_parallel), and only then + bias: added before the sum,
    # hint: it would be counted t times
    raise NotImplementedError(
        "this rank's partial product F.linear(x, weight) (no bias yet), summed over the ranks"
        ' by g (reduce_from_parallel), and only then + bias: added before the sum, it would '
        'be counted t times'
    )
