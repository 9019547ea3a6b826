"""ex02 on the ranks: each part (f, g, the column and row layers, the MLP) run against
a dense reference every rank computes by itself from seeded inputs, its numbers, the
usual mistakes it matches and its collectives recorded for the parent (ex02.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime import trace
from ._parts import Measure, _err, ops_since, run_parts

TOLERANCE = 1e-10  # float64: the shards add in another order than the dense matmul
BATCH, SEQ = 2, 3
D_SMALL, D_WIDE = 5, 12  # column: 5 -> 12, row: 12 -> 5; 2, 3 and 4 all divide 12


def _randn(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _leaf(x):
    return x.detach().clone().requires_grad_(True)


def _close(got, expected) -> bool:
    return got is not None and got.shape == expected.shape and _err(got, expected) <= TOLERANCE


def _part_f(ns, axis):
    t, r = axis.size, axis.rank
    m = Measure()
    x = _leaf(_randn(BATCH, SEQ, D_SMALL, seed=11))  # replicated: the same on every rank
    grads = [_randn(BATCH, SEQ, D_SMALL, seed=100 + k) for k in range(t)]  # per rank
    start = len(trace.events())
    y = ns["CopyToParallel"].apply(x, axis)
    fwd = ops_since(start)
    m.compare("f(x)", y, x.detach())
    if isinstance(y, torch.Tensor) and _close(y, t * x.detach()):
        m.mistakes.append("f-forward-sums")
    start = len(trace.events())
    if isinstance(y, torch.Tensor) and y.requires_grad:
        (y * grads[r]).sum().backward()
    bwd = ops_since(start)
    m.compare("dL/dx", x.grad, sum(grads))
    if _close(x.grad, grads[r]):
        m.mistakes.append("f-backward-identity")
    return m.result((fwd, bwd))


def _part_g(ns, axis):
    t, r = axis.size, axis.rank
    m = Measure()
    xs = [_randn(BATCH, SEQ, D_SMALL, seed=200 + k) for k in range(t)]  # per rank
    x = _leaf(xs[r])
    upstream = _randn(BATCH, SEQ, D_SMALL, seed=12)  # replicated
    start = len(trace.events())
    y = ns["ReduceFromParallel"].apply(x, axis)
    fwd = ops_since(start)
    m.compare("g(x)", y, sum(xs))
    if isinstance(y, torch.Tensor) and _close(y, xs[r]):
        m.mistakes.append("g-forward-identity")
    start = len(trace.events())
    if isinstance(y, torch.Tensor) and y.requires_grad:
        (y * upstream).sum().backward()
    bwd = ops_since(start)
    m.compare("dL/dx", x.grad, upstream)
    if _close(x.grad, t * upstream):
        m.mistakes.append("g-backward-sums")
    return m.result((fwd, bwd))


def _dense_linear(d_in, d_out, seed):
    weight = _randn(d_out, d_in, seed=seed) / d_in**0.5
    bias = _randn(d_out, seed=seed + 1)  # large enough that a bias mistake cannot hide
    return weight, bias


def _part_column(ns, axis):
    t, r = axis.size, axis.rank
    m = Measure()
    weight, bias = _dense_linear(D_SMALL, D_WIDE, seed=21)
    x_full = _randn(BATCH, SEQ, D_SMALL, seed=22)
    upstream = _randn(BATCH, SEQ, D_WIDE, seed=23)  # dL/dY, of which rank r gets its slice
    dense = F.linear(x_full, weight, bias)
    x, w, b = _leaf(x_full), _leaf(weight.chunk(t, 0)[r]), _leaf(bias.chunk(t)[r])
    start = len(trace.events())
    y = ns["column_parallel_linear"](x, w, b, axis)
    fwd = ops_since(start)
    m.compare("output Y_r", y, dense.chunk(t, -1)[r])
    if isinstance(y, torch.Tensor) and _close(y, t * F.linear(x_full, w.detach()) + b.detach()):
        m.mistakes.append("f-forward-sums")
    start = len(trace.events())
    if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == dense.chunk(t, -1)[r].shape:
        (y * upstream.chunk(t, -1)[r]).sum().backward()
    bwd = ops_since(start)
    m.compare("dL/dX", x.grad, upstream @ weight)
    if _close(x.grad, upstream.chunk(t, -1)[r] @ weight.chunk(t, 0)[r]):
        m.mistakes.append("f-backward-identity")
    flat_up, flat_x = upstream.reshape(-1, D_WIDE), x_full.reshape(-1, D_SMALL)
    m.compare("weight shard's gradient", w.grad, (flat_up.T @ flat_x).chunk(t, 0)[r])
    m.compare("bias shard's gradient", b.grad, flat_up.sum(0).chunk(t)[r])
    return m.result((fwd, bwd))


def _part_row(ns, axis):
    t, r = axis.size, axis.rank
    m = Measure()
    weight, bias = _dense_linear(D_WIDE, D_SMALL, seed=31)
    x_full = _randn(BATCH, SEQ, D_WIDE, seed=32)
    upstream = _randn(BATCH, SEQ, D_SMALL, seed=33)  # dL/dY, replicated
    dense = F.linear(x_full, weight, bias)
    x, w, b = _leaf(x_full.chunk(t, -1)[r]), _leaf(weight.chunk(t, 1)[r]), _leaf(bias)
    start = len(trace.events())
    y = ns["row_parallel_linear"](x, w, b, axis)
    fwd = ops_since(start)
    m.compare("output Y", y, dense)
    if isinstance(y, torch.Tensor) and y.shape == dense.shape:
        if _close(y, dense + (t - 1) * bias):
            m.mistakes.append("bias-before-sum")
        elif _close(y, dense - bias):
            m.mistakes.append("bias-missing")
        elif _close(y, F.linear(x.detach(), w.detach()) + bias):
            m.mistakes.append("g-forward-identity")
    start = len(trace.events())
    if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == dense.shape:
        (y * upstream).sum().backward()
    bwd = ops_since(start)
    expected_dx = (upstream @ weight).chunk(t, -1)[r]
    m.compare("dL/dX_r", x.grad, expected_dx)
    if _close(x.grad, t * expected_dx):
        m.mistakes.append("g-backward-sums")
    flat_up, flat_x = upstream.reshape(-1, D_SMALL), x_full.reshape(-1, D_WIDE)
    m.compare("weight shard's gradient", w.grad, (flat_up.T @ flat_x).chunk(t, 1)[r])
    if b.grad is None and not m.problem:
        m.problem = "the bias received no gradient on this rank"
        m.mistakes.append("bias-not-every-rank")
    m.compare("bias gradient", b.grad, flat_up.sum(0))
    return m.result((fwd, bwd))


def _part_mlp(ns, axis):
    t, r = axis.size, axis.rank
    m = Measure()
    w1, b1 = _dense_linear(D_SMALL, D_WIDE, seed=41)
    w2, b2 = _dense_linear(D_WIDE, D_SMALL, seed=43)
    x_full = _randn(BATCH, SEQ, D_SMALL, seed=45)
    upstream = _randn(BATCH, SEQ, D_SMALL, seed=46)
    dense = [_leaf(v) for v in (x_full, w1, b1, w2, b2)]
    dx, dw1, db1, dw2, db2 = torch.autograd.grad(
        (F.linear(F.gelu(F.linear(dense[0], dense[1], dense[2])), dense[3], dense[4])
         * upstream).sum(), dense)
    expected_out = F.linear(F.gelu(F.linear(x_full, w1, b1)), w2, b2)
    x = _leaf(x_full)
    s1, c1 = _leaf(w1.chunk(t, 0)[r]), _leaf(b1.chunk(t)[r])
    s2, c2 = _leaf(w2.chunk(t, 1)[r]), _leaf(b2)
    start = len(trace.events())
    hidden = F.gelu(ns["column_parallel_linear"](x, s1, c1, axis))
    y = ns["row_parallel_linear"](hidden, s2, c2, axis)
    fwd = ops_since(start)
    m.compare("output", y, expected_out)
    start = len(trace.events())
    if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == expected_out.shape:
        (y * upstream).sum().backward()
    bwd = ops_since(start)
    m.compare("dL/dX", x.grad, dx)
    m.compare("fc weight shard's gradient", s1.grad, dw1.chunk(t, 0)[r])
    m.compare("fc bias shard's gradient", c1.grad, db1.chunk(t)[r])
    m.compare("proj weight shard's gradient", s2.grad, dw2.chunk(t, 1)[r])
    m.compare("proj bias gradient", c2.grad, db2)
    return m.result((fwd, bwd))


_PART_FUNCTIONS = {"f": _part_f, "g": _part_g, "column": _part_column, "row": _part_row,
                   "mlp": _part_mlp}


def _in_rank(ns: dict) -> dict:
    return run_parts(_PART_FUNCTIONS, ns)
