"""2D tensor parallelism: one linear layer on a q × q grid of ranks, SUMMA-style.

Megatron's (1D) tensor parallelism splits a weight one way across N ranks and
all-reduces an activation of the whole batch for every layer. 2D tensor
parallelism (Optimus, Xu et al. 2021; Colossal-AI's "2D") lays the N = q² ranks
out on a q × q grid and splits *both* the activation X (tokens × d_in) and the
weight W (d_in × d_out) into q × q blocks. Rank (i, j) holds

    X_ij   rows block i of the tokens, columns block j of d_in
    W_ij   rows block i of d_in,       columns block j of d_out
    b_j    columns block j of the bias (every rank of grid column j holds it)

and computes its block of Y = XW + b by SUMMA (van de Geijn & Watts 1997):

    Y_ij = Σ_k X_ik W_kj + b_j

X_ik lives on rank (i, k), in this rank's grid *row*; W_kj on rank (k, j), in its
grid *column*. So for each k, rank (i, k) broadcasts its X block along row i
and rank (k, j) its W block along column j, and every rank adds one product.
Done for all k at once, those q broadcasts are one all-gather along the row and
one along the column (``collective="all_gather"``, the default: 2 collectives
where the broadcasts pay 2q; the same bytes per rank in the ring model).

Backward is the conjugate: the gradient of a gather is a reduce-scatter. Rank
(i, j) forms its partial dX_i· = dY_ij W_·jᵀ and partial dW_·j = X_i·ᵀ dY_ij; the
row reduce-scatters the first (rank (i, k) gets dX_ik = Σ_j dY_ij W_kjᵀ), the
column the second (rank (k, j) gets dW_kj = Σ_i X_ikᵀ dY_ij). The bias block's
gradient is a sum over the column's token blocks: one small all-reduce.

The weight is kept in ``nn.Linear``'s layout, (d_out, d_in): rank (i, j) holds
the block ``linear.weight[j-th d_out block, i-th d_in block]`` = W_ijᵀ.
Every collective goes through `minitp.runtime.comm`, so the trace shows each of them,
on the axes named "row" and "col".
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..rules import check_positive_int
from ..runtime import comm, trace
from ..runtime.mesh import Axis, _require_initialized
from .layers import _dense_init

COLLECTIVES = ("all_gather", "broadcast")


def grid_layout(q: int) -> dict[str, list[list[int]]]:
    """The row and column groups of a q × q grid, without any processes.
    Rank (i, j) is global rank i·q + j: rows are runs of adjacent ranks.

    >>> grid_layout(2)
    {'row': [[0, 1], [2, 3]], 'col': [[0, 2], [1, 3]]}
    """
    check_positive_int("q", q)
    grid = torch.arange(q * q).reshape(q, q)
    return {"row": grid.tolist(), "col": grid.T.tolist()}


class Grid:
    """This rank's place on a q × q grid: its ``row`` and ``col`` axes.

    Create it inside a launched function, on every rank, on a world of q² ranks
    (q defaults to √world). ``row`` is the `Axis` of the q ranks of this rank's
    grid row, indexed by column (``row.rank == j``); ``col`` that of its grid
    column, indexed by row (``col.rank == i``). Like `minitp.runtime.mesh.Mesh`, every
    group is a `torch.distributed` group made by every rank in the same order,
    and nothing is global.
    """

    def __init__(self, q: int | None = None):
        _require_initialized("Grid(...)")
        world_size = dist.get_world_size()
        if q is None and math.isqrt(world_size) ** 2 != world_size:
            raise ValueError(f"a q x q grid needs a square number of ranks (4, 9, 16, ...), "
                             f"but this run has world size {world_size}")
        q = math.isqrt(world_size) if q is None else q
        if q * q != world_size:
            raise ValueError(f"a {q} x {q} grid needs {q * q} ranks, but this run has "
                             f"world size {world_size}")
        me = dist.get_rank()
        axes = {}
        for name, groups in grid_layout(q).items():
            for ranks in groups:  # every rank must create every group, in the same order
                group = dist.new_group(ranks) if len(ranks) < world_size else dist.group.WORLD
                if me in ranks:
                    axes[name] = Axis(name, tuple(ranks), ranks.index(me), group)
        self.q, self.rank = q, me
        self.row: Axis = axes["row"]
        self.col: Axis = axes["col"]

    @property
    def i(self) -> int:
        """This rank's grid row."""
        return self.col.rank

    @property
    def j(self) -> int:
        """This rank's grid column."""
        return self.row.rank

    def __repr__(self) -> str:
        return (f"Grid({self.q}x{self.q}) on rank {self.rank}: (i, j) = ({self.i}, {self.j}), "
                f"row {list(self.row.ranks)}, col {list(self.col.ranks)}")


def split_2d(x: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Rank (i, j)'s block of a matrix every rank holds whole: rows block i, columns
    block j (of the last dimension; leading dimensions are flattened into rows)."""
    x = x.reshape(-1, x.shape[-1])
    for size, what in ((x.shape[0], "rows"), (x.shape[1], "columns")):
        if size % grid.q:
            raise ValueError(f"{what}={size} is not divisible by the grid size q={grid.q}")
    return x.chunk(grid.q, 0)[grid.i].chunk(grid.q, 1)[grid.j].contiguous()


def gather_2d(block: torch.Tensor, grid: Grid) -> torch.Tensor:
    """The whole matrix from every rank's block (the inverse of `split_2d`), on every
    rank: gathered along the row, then along the column. Traced; no gradient."""
    return comm.all_gather(comm.all_gather(block, grid.row, dim=1), grid.col, dim=0)


class _Summa(torch.autograd.Function):
    """Y_ij = Σ_k X_ik W_kj + b_j forward; the conjugate reduce-scatters backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, grid, collective):
        ctx.grid, ctx.label = grid, trace.recorder().label
        q = grid.q
        if collective == "broadcast":  # SUMMA as written: step k, root k of each axis
            x_blocks = [comm.broadcast(x, grid.row, src=k) for k in range(q)]
            w_blocks = [comm.broadcast(weight, grid.col, src=k) for k in range(q)]
            x_row, w_col = torch.cat(x_blocks, 1), torch.cat(w_blocks, 1)
        else:  # the q broadcasts of each axis at once
            x_row = comm.all_gather(x, grid.row, dim=1)  # X_i·: (T/q, d_in)
            w_col = comm.all_gather(weight, grid.col, dim=1)  # W_·jᵀ: (d_out/q, d_in)
            x_blocks, w_blocks = x_row.chunk(q, 1), w_col.chunk(q, 1)
        y = torch.zeros(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        for x_ik, w_kj in zip(x_blocks, w_blocks, strict=True):  # SUMMA's outer loop
            y += F.linear(x_ik, w_kj)
        ctx.save_for_backward(x_row, w_col)
        ctx.has_bias = bias is not None
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):
        x_row, w_col = ctx.saved_tensors
        grid = ctx.grid
        with trace.relabel(ctx.label):  # backward runs after the forward's label ended
            # dX_ik = Σ_j dY_ij W_kjᵀ: each rank's term for the whole row block, summed
            # along the row, block k to rank (i, k)
            grad_x = comm.reduce_scatter(grad @ w_col, grid.row, dim=1)
            # dW_kj = Σ_i X_ikᵀ dY_ij: summed along the column, block k to rank (k, j)
            grad_w = comm.reduce_scatter(grad.T @ x_row, grid.col, dim=1)
            grad_b = comm.all_reduce(grad.sum(0), grid.col) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


class Linear2D(nn.Module):
    """Y = XW + b on a q × q `Grid`, by SUMMA (see the module docstring).

    Takes this rank's block X_ij, of shape (tokens/q, d_in/q) (leading dimensions
    are flattened into tokens), and returns its block Y_ij, (tokens/q, d_out/q):
    the layout of its input, so a second Linear2D can follow with nothing in
    between. ``collective``: "all_gather" (one per axis) or "broadcast" (q per
    axis, SUMMA's loop as written). Built directly under one seed, the ranks'
    blocks are blocks of one dense N(0, 0.02²) initialisation, zero bias.
    """

    def __init__(self, d_in: int, d_out: int, grid: Grid, bias: bool = True,
                 collective: str = "all_gather", dtype=None, device=None):
        super().__init__()
        if collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
        for size, what in ((d_in, "d_in"), (d_out, "d_out")):
            if size % grid.q:
                raise ValueError(f"{what}={size} is not divisible by the grid size q={grid.q}")
        self.grid, self.collective, self.d_in, self.d_out = grid, collective, d_in, d_out
        dense = _dense_init(d_out, d_in, dtype, device)  # every rank draws it whole
        rows, cols = d_out // grid.q, d_in // grid.q
        self.weight = nn.Parameter(dense[grid.j * rows:][:rows, grid.i * cols:][:, :cols].clone())
        self.bias = nn.Parameter(torch.zeros(rows, dtype=dtype, device=device)) if bias else None

    def forward(self, x):
        lead = x.shape[:-1]
        with trace.forward_phase():
            y = _Summa.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias, self.grid,
                             self.collective)
        return y.reshape(*lead, y.shape[-1])

    @classmethod
    def from_dense(cls, module: nn.Linear, grid: Grid, **kw) -> Linear2D:
        """Rank (i, j)'s blocks of a dense ``nn.Linear``: weight block (j, i) of its
        (d_out, d_in) matrix, bias block j (weights copied, not shared)."""
        layer = cls(module.in_features, module.out_features, grid, bias=module.bias is not None,
                    dtype=module.weight.dtype, device=module.weight.device, **kw)
        with torch.no_grad():
            block = module.weight.chunk(grid.q, 0)[grid.j].chunk(grid.q, 1)[grid.i]
            layer.weight.copy_(block)
            if module.bias is not None:
                layer.bias.copy_(module.bias.chunk(grid.q)[grid.j])
        return layer

    def extra_repr(self) -> str:
        return (f"d_in={self.d_in}, d_out={self.d_out} (this rank: weight block "
                f"{tuple(self.weight.shape)}), grid {self.grid.q}x{self.grid.q} at "
                f"({self.grid.i}, {self.grid.j}), collective={self.collective}")
