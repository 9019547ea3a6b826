"""Gloo's rules for gathers and scatters, written once for the blocking and the
non-blocking forms: the tensor variants (``all_gather_single``,
``reduce_scatter_single``), blocks moved into place along any dim, equal shapes."""

from __future__ import annotations

import torch

from .mesh import Axis


def gather_buffers(x, axis: Axis, dim: int):
    """The contiguous input, the (n*d0, ...) output the backends want (rank r's
    tensor is its r-th block; None on an axis of one rank), and `dim` made positive."""
    local = x.detach().contiguous()
    if axis.size == 1:
        return local, None, dim % x.dim()
    out = torch.empty((axis.size * local.shape[0], *local.shape[1:]), dtype=x.dtype,
                      device=x.device)
    return local, out, dim % x.dim()


def gathered_along(out, local, n: int, dim: int) -> torch.Tensor:
    if dim == 0:
        return out  # already in place
    # (n, ..., d, ...) -> (..., n, d, ...) -> (..., n*d, ...): rank r's block lands r-th
    shape = list(local.shape)
    shape[dim] *= n
    return out.view(n, *local.shape).movedim(0, dim).reshape(shape)


def scatter_buffers(x, axis: Axis, dim: int):
    """The input laid out chunk-first as the backends want it, (n*c0, ...), and the
    output chunk (both None on an axis of one rank)."""
    n = axis.size
    dim = dim % x.dim()
    if x.shape[dim] % n:
        raise ValueError(
            f"reduce_scatter: dimension {dim} of shape {tuple(x.shape)} is not divisible "
            f"by the {axis.name} size {n}"
        )
    if n == 1:
        return None, None
    # (..., n*c, ...) -> (..., n, c, ...) -> (n, ..., c, ...): chunk i first, for rank i.
    # Its rank-i slice is then exactly the output's layout, so no copy afterwards.
    shape = list(x.shape)
    split = shape[:dim] + [n, shape[dim] // n] + shape[dim + 1:]
    chunks_first = x.detach().reshape(split).movedim(dim, 0).contiguous()
    out = torch.empty(chunks_first.shape[1:], dtype=x.dtype, device=x.device)
    return chunks_first.view(n * out.shape[0], *out.shape[1:]), out
