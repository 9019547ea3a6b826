"""Lab: 2D (SUMMA) tensor parallelism beside 1D (Megatron) on the same linear layer.

    errors = mt.launch(equivalence_errors, 4, tokens=8, d=8, hidden=16)[0]
    table = wire_bytes(tokens=256, d_in=64, d_out=64, world=4)   # one launch, 4 schemes

`equivalence_errors` runs on every rank: a two-layer network (Linear2D, GELU,
Linear2D) against the same dense layers on one process, in float64, and returns
the largest difference of the output and of every gradient, gathered back.
`layernorm_errors` does the same for `LayerNorm2D`, the lesson's LayerNorm on the
grid (the library's 2D code has only the linear layer): its statistics are summed
along the grid row, where a token's features lie.

`wire_bytes` launches `world` ranks and runs one forward and backward of the
same layer seven ways: 1D row- and column-parallel, each with and without
sequence parallelism, 2D with all-gathers and with SUMMA's broadcasts (both
`Linear2D`, which saves the gathered blocks for backward), and 2D that gathers
them again in backward (`Linear2DRegather`, Optimus's choice, written here: the
library's `Linear2D` saves them). For each rank and scheme it returns the bytes
measured (each collective's ``sent_bytes``: what the kernel counted the rank
writing to its sockets, `minitp.runtime.io_counters`), the trace's ring model of the
same events, the collectives counted, the time spent in them, and the bytes autograd
kept for backward (`minitp.memory.ActivationLedger`); `minitp.calc.network.two_d` has the
formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...memory.activations import ActivationLedger
from ...runtime import comm, trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from ...tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ...tensor_parallel.two_d import Grid, Linear2D, gather_2d, split_2d

SCHEMES = ("1d-row", "1d-column", "1d-sp-row", "1d-sp-column", "2d", "2d-broadcast",
           "2d-regather")


class _SummaRegather(torch.autograd.Function):
    """`Linear2D`'s SUMMA, keeping only this rank's own blocks: backward gathers X_i·
    and W_·j again before its reduce-scatters (three moves per tensor, not two)."""

    @staticmethod
    def forward(ctx, x, weight, bias, grid):
        ctx.grid, ctx.label, ctx.has_bias = grid, trace.recorder().label, bias is not None
        x_row = comm.all_gather(x, grid.row, dim=1)  # X_i·: (T/q, d_in)
        w_col = comm.all_gather(weight, grid.col, dim=1)  # W_·jᵀ: (d_out/q, d_in)
        ctx.save_for_backward(x, weight)  # own blocks: x_row and w_col are freed here
        y = F.linear(x_row, w_col)  # Σ_k X_ik W_kj in one product
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grid = ctx.grid
        with trace.relabel(ctx.label):
            x_row = comm.all_gather(x, grid.row, dim=1)  # gathered again
            w_col = comm.all_gather(weight, grid.col, dim=1)
            grad_x = comm.reduce_scatter(grad @ w_col, grid.row, dim=1)
            grad_w = comm.reduce_scatter(grad.T @ x_row, grid.col, dim=1)
            grad_b = comm.all_reduce(grad.sum(0), grid.col) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


class Linear2DRegather(Linear2D):
    """`Linear2D` with Optimus's backward: the gathered blocks are not kept but gathered
    again (more bytes, no q× copies held between forward and backward)."""

    def forward(self, x):
        lead = x.shape[:-1]
        with trace.forward_phase():
            y = _SummaRegather.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias,
                                     self.grid)
        return y.reshape(*lead, y.shape[-1])


def _layer_2d(dense: nn.Linear, grid: Grid, collective: str):
    if collective == "regather":
        return Linear2DRegather.from_dense(dense, grid)
    return Linear2D.from_dense(dense, grid, collective=collective)


def equivalence_errors(tokens: int, d: int, hidden: int, collective: str = "all_gather",
                       bias: bool = True) -> dict[str, float]:
    """On a q × q grid (the launched world): fc (d → hidden), GELU, proj (hidden → d)
    as Linear2D layers (``collective``: "all_gather", "broadcast", or "regather" for
    `Linear2DRegather`) against the dense ones, float64. The largest absolute
    difference of each compared tensor, over this rank's blocks, gathered back."""
    grid = Grid()
    torch.manual_seed(0)  # the same dense layers and data on every rank
    dev = device()
    fc = nn.Linear(d, hidden, bias=bias).double().to(dev)
    proj = nn.Linear(hidden, d, bias=bias).double().to(dev)
    x = torch.randn(tokens, d, dtype=torch.float64, device=dev, requires_grad=True)
    weights = torch.randn(tokens, d, dtype=torch.float64, device=dev)  # a loss that mixes all
    y = proj(F.gelu(fc(x)))
    (y * weights).sum().backward()

    p_fc, p_proj = _layer_2d(fc, grid, collective), _layer_2d(proj, grid, collective)
    x_ij = split_2d(x.detach(), grid).requires_grad_()
    y_ij = p_proj(F.gelu(p_fc(x_ij)))  # Y's block (i, j): the layout X came in
    (y_ij * split_2d(weights, grid)).sum().backward()

    def block(t):  # rank (i, j)'s weight block of a dense (d_out, d_in) tensor
        return t.chunk(grid.q, 0)[grid.j].chunk(grid.q, 1)[grid.i]

    with trace.label("gather back"):
        errors = {
            "output": (gather_2d(y_ij.detach(), grid) - y.detach()).abs().max().item(),
            "input grad": (gather_2d(x_ij.grad, grid) - x.grad).abs().max().item(),
        }
    for name, dense, layer in (("fc", fc, p_fc), ("proj", proj, p_proj)):
        errors[f"{name}.weight grad"] = (layer.weight.grad - block(dense.weight.grad)).abs().max()
        if bias:
            expected = dense.bias.grad.chunk(grid.q)[grid.j]
            errors[f"{name}.bias grad"] = (layer.bias.grad - expected).abs().max()
    return {name: float(e) for name, e in errors.items()}


class _LayerNorm2D(torch.autograd.Function):
    """LayerNorm of this rank's block X_ij: each token's d features lie along the grid row,
    so every per-token sum is an all-reduce along it (Σx, Σx² forward; Σg, Σg·x̂ backward,
    g = dY·γ), each its own, as Colossal-AI's LayerNorm2D; γ_j and β_j, held by every rank
    of column j, get their gradients summed along the column, as `Linear2D`'s bias."""

    @staticmethod
    def forward(ctx, x, weight, bias, grid, eps):
        ctx.grid, ctx.label, ctx.d = grid, trace.recorder().label, x.shape[-1] * grid.q
        mean = comm.all_reduce(x.sum(-1), grid.row) / ctx.d
        square = comm.all_reduce((x * x).sum(-1), grid.row) / ctx.d
        rstd = (square - mean * mean + eps).rsqrt()[:, None]
        x_hat = (x - mean[:, None]) * rstd
        ctx.save_for_backward(x_hat, rstd, weight)
        return x_hat * weight + bias

    @staticmethod
    def backward(ctx, grad):
        x_hat, rstd, weight = ctx.saved_tensors
        grid, d = ctx.grid, ctx.d
        with trace.relabel(ctx.label):
            g = grad * weight
            mean_g = comm.all_reduce(g.sum(-1), grid.row)[:, None] / d
            mean_gx = comm.all_reduce((g * x_hat).sum(-1), grid.row)[:, None] / d
            grad_x = (g - mean_g - x_hat * mean_gx) * rstd
            grad_w = comm.all_reduce((grad * x_hat).sum(0), grid.col)
            grad_b = comm.all_reduce(grad.sum(0), grid.col)
        return grad_x, grad_w, grad_b, None, None


class LayerNorm2D(nn.Module):
    """A dense ``nn.LayerNorm``'s blocks on a q × q `Grid`: takes and returns X_ij, holds
    γ_j and β_j (the library has no 2D LayerNorm; this one is the lesson's)."""

    def __init__(self, dense: nn.LayerNorm, grid: Grid):
        super().__init__()
        self.grid, self.eps = grid, dense.eps
        self.weight = nn.Parameter(dense.weight.detach().chunk(grid.q)[grid.j].clone())
        self.bias = nn.Parameter(dense.bias.detach().chunk(grid.q)[grid.j].clone())

    def forward(self, x):
        with trace.forward_phase():
            y = _LayerNorm2D.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias,
                                   self.grid, self.eps)
        return y.reshape(x.shape)


def layernorm_errors(tokens: int, d: int) -> dict[str, float]:
    """On a q × q grid (the launched world): `LayerNorm2D` against ``nn.LayerNorm(d)`` with
    random γ and β on one process, float64; the largest difference of the output and of
    every gradient, over this rank's blocks (output and input gradient gathered back)."""
    grid = Grid()
    torch.manual_seed(0)
    dev = device()
    dense = nn.LayerNorm(d).double().to(dev)
    with torch.no_grad():
        dense.weight.normal_(1.0, 0.5)
        dense.bias.normal_(0.0, 0.5)
    x = torch.randn(tokens, d, dtype=torch.float64, device=dev, requires_grad=True)
    weights = torch.randn(tokens, d, dtype=torch.float64, device=dev)
    y = dense(x)
    (y * weights).sum().backward()

    layer = LayerNorm2D(dense, grid)
    x_ij = split_2d(x.detach(), grid).requires_grad_()
    y_ij = layer(x_ij)
    (y_ij * split_2d(weights, grid)).sum().backward()
    with trace.label("gather back"):
        errors = {"output": (gather_2d(y_ij.detach(), grid) - y.detach()).abs().max(),
                  "input grad": (gather_2d(x_ij.grad, grid) - x.grad).abs().max()}
    for name in ("weight", "bias"):
        expected = getattr(dense, name).grad.chunk(grid.q)[grid.j]
        errors[f"{name} grad"] = (getattr(layer, name).grad - expected).abs().max()
    return {name: float(e) for name, e in errors.items()}


@dataclass(frozen=True)
class SchemeBytes:
    """One rank's traffic for one scheme: forward + backward of the layer."""

    scheme: str
    rank: int
    collectives: tuple[str, ...]  # "op@axis" in the order the rank ran them
    model_bytes: int  # the trace's ring model of those events (a MODEL)
    sent_bytes: int | None  # measured: the kernel's count; None where not measurable
    comm_seconds: float  # measured: wall-clock time inside those collectives
    saved_bytes: int  # measured: what autograd kept from forward to backward (the ledger)


def _one_pass(scheme: str, dense: nn.Linear, x, grad, grid: Grid) -> int:
    """Forward and backward of `dense`'s layer split by `scheme`, on this rank; returns
    the bytes autograd kept for backward, measured by the ledger (weights left out)."""
    if scheme.startswith("2d"):
        collective = {"2d": "all_gather", "2d-broadcast": "broadcast"}.get(scheme, "regather")
        layer = _layer_2d(dense, grid, collective)
        x_local, g_local = split_2d(x, grid), split_2d(grad, grid)
    else:
        axis, sp = world(), "-sp-" in scheme

        def part(t, dim):  # this rank's slice of t along dim
            return t.chunk(axis.size, dim)[axis.rank]

        x, grad = x[None], grad[None]  # (1, T, d): dim 1 is the sequence
        if scheme.endswith("row"):  # input split by features; output whole (or by tokens)
            layer = RowParallelLinear.from_dense(dense, axis, sequence_parallel=sp)
            x_local, g_local = part(x, 2), part(grad, 1) if sp else grad
        else:  # column: input whole (or by tokens); output split by features
            layer = ColumnParallelLinear.from_dense(dense, axis, sequence_parallel=sp)
            x_local, g_local = part(x, 1) if sp else x, part(grad, 2)
    x_local = x_local.contiguous().requires_grad_()
    with ActivationLedger(layer) as ledger:
        y = layer(x_local)
    y.backward(g_local.contiguous())
    return ledger.total_bytes


def _measure(tokens: int, d_in: int, d_out: int) -> list[SchemeBytes]:
    torch.manual_seed(0)
    dev = device()
    dense = nn.Linear(d_in, d_out).double().to(dev)
    x = torch.randn(tokens, d_in, dtype=torch.float64, device=dev)
    grad = torch.randn(tokens, d_out, dtype=torch.float64, device=dev)
    grid = Grid()  # every rank makes the grid's groups, once
    with trace.paused():  # warm-up: gloo's first message on a pair of ranks is not the layer's
        for scheme in SCHEMES:
            _one_pass(scheme, dense, x, grad, grid)
    rank = torch.distributed.get_rank()
    rows = []
    for scheme in SCHEMES:
        before = len(trace.events())
        with trace.label(scheme):
            saved = _one_pass(scheme, dense, x, grad, grid)
        events = [e for e in trace.events()[before:] if e.is_comm]
        sent = [e.sent_bytes for e in events]
        rows.append(SchemeBytes(scheme, rank, tuple(f"{e.op}@{e.axis}" for e in events),
                                sum(e.model_bytes for e in events),
                                None if None in sent else sum(sent),
                                sum(e.duration for e in events), saved))
    return rows


def wire_bytes(tokens: int, d_in: int, d_out: int, world: int = 4,
               timeout: float = 60.0) -> dict[str, list[SchemeBytes]]:
    """Launch `world` ranks (a square: 4, 9; dividing tokens, d_in and d_out) and
    measure each scheme's bytes per rank:
    {scheme: [rank 0's SchemeBytes, rank 1's, ...]}."""
    run = launch(_measure, world, tokens, d_in, d_out, timeout=timeout)
    return {scheme: [run[r][k] for r in range(world)] for k, scheme in enumerate(SCHEMES)}
