"""Lab: 2D (SUMMA) tensor parallelism beside 1D (Megatron) on the same linear layer.

    errors = mt.launch(equivalence_errors, 4, tokens=8, d=8, hidden=16)[0]
    table = wire_bytes(tokens=256, d_in=64, d_out=64, world=4)   # one launch, 4 schemes

`equivalence_errors` runs on every rank: a two-layer network (Linear2D, GELU,
Linear2D) against the same dense layers on one process, in float64, and returns
the largest difference of the output and of every gradient, gathered back.

`wire_bytes` launches `world` ranks and runs one forward and backward of the
same layer four ways: 1D row-parallel, 1D column-parallel, 2D with all-gathers
and 2D with SUMMA's broadcasts. For each rank and scheme it returns the bytes
measured (each collective's ``sent_bytes``: what the kernel counted the rank
writing to its sockets, `minitp.runtime.io_counters`), the trace's ring model of the
same events, the collectives counted and the time spent in them;
`minitp.calc.two_d` has the formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from ...tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from ...tensor_parallel.two_d import Grid, Linear2D, gather_2d, split_2d

SCHEMES = ("1d-row", "1d-column", "2d", "2d-broadcast")


def equivalence_errors(tokens: int, d: int, hidden: int, collective: str = "all_gather",
                       bias: bool = True) -> dict[str, float]:
    """On a q × q grid (the launched world): fc (d → hidden), GELU, proj (hidden → d)
    as Linear2D layers against the dense ones, float64. The largest absolute
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

    p_fc = Linear2D.from_dense(fc, grid, collective=collective)
    p_proj = Linear2D.from_dense(proj, grid, collective=collective)
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


@dataclass(frozen=True)
class SchemeBytes:
    """One rank's traffic for one scheme: forward + backward of the layer."""

    scheme: str
    rank: int
    collectives: tuple[str, ...]  # "op@axis" in the order the rank ran them
    model_bytes: int  # the trace's ring model of those events (a MODEL)
    sent_bytes: int | None  # measured: the kernel's count; None where not measurable
    comm_seconds: float  # measured: wall-clock time inside those collectives


def _one_pass(scheme: str, dense: nn.Linear, x, grad, grid: Grid):
    """Forward and backward of `dense`'s layer split by `scheme`, on this rank."""
    if scheme.startswith("2d"):
        collective = "broadcast" if scheme == "2d-broadcast" else "all_gather"
        layer = Linear2D.from_dense(dense, grid, collective=collective)
        x_local, g_local = split_2d(x, grid), split_2d(grad, grid)
    else:
        axis = world()
        if scheme == "1d-row":  # input split by features, output whole
            layer = RowParallelLinear.from_dense(dense, axis)
            x_local, g_local = x.chunk(axis.size, 1)[axis.rank], grad
        else:  # "1d-column": input whole, output split by features
            layer = ColumnParallelLinear.from_dense(dense, axis)
            x_local, g_local = x, grad.chunk(axis.size, 1)[axis.rank]
    x_local = x_local.contiguous().requires_grad_()
    layer(x_local).backward(g_local.contiguous())


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
            _one_pass(scheme, dense, x, grad, grid)
        events = [e for e in trace.events()[before:] if e.is_comm]
        sent = [e.sent_bytes for e in events]
        rows.append(SchemeBytes(scheme, rank, tuple(f"{e.op}@{e.axis}" for e in events),
                                sum(e.model_bytes for e in events),
                                None if None in sent else sum(sent),
                                sum(e.duration for e in events)))
    return rows


def wire_bytes(tokens: int, d_in: int, d_out: int, world: int = 4,
               timeout: float = 60.0) -> dict[str, list[SchemeBytes]]:
    """Launch `world` ranks (a square: 4, 9) and measure each scheme's bytes per rank:
    {scheme: [rank 0's SchemeBytes, rank 1's, ...]}."""
    run = launch(_measure, world, tokens, d_in, d_out, timeout=timeout)
    return {scheme: [run[r][k] for r in range(world)] for k, scheme in enumerate(SCHEMES)}
