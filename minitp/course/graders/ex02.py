"""Checks for ex02: f and g, and the column- and row-parallel linear layers.

At t = 2, 3 and 4 ranks, in float64, against dense references that every rank
computes by itself from seeded inputs (so the reference uses no communication
and none of the learner's code):

1. f alone: identity forward, the sum of every rank's gradient backward;
2. g alone: the sum of every rank's input forward, the gradient unchanged backward;
3. the column-parallel layer: its output slice, dL/dX, its weight and bias shards' gradients;
4. the row-parallel layer: the output (bias added once), dL/dX_r, the weight shard's
   and the whole bias's gradients;
5. column → GELU → row equals the dense two-layer MLP, output and every gradient;
6. the trace: exactly the collectives Megatron's layers need (f: one all-reduce
   backward; g: one forward; the MLP: one each way), and nothing else.

A failure names t, the rank, the tensor and the largest error, with a hint aimed
at the usual mistakes (an all-reduce in f's forward, none in its backward, the
bias added before the reduction, an all-reduce in g's backward).

Why one file: every check of one exercise sits together, in the order the
learner meets them, so that a learner reading why a check failed finds all of
that exercise's expectations on one page.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime import trace
from ._parts import Measure, _err, exception_check, grade_in_parts, ops_since, run_parts
from .base import Check

WORLD_SIZES = (2, 3, 4)
TOLERANCE = 1e-10  # float64: the shards add in another order than the dense matmul
BATCH, SEQ = 2, 3
D_SMALL, D_WIDE = 5, 12  # column: 5 -> 12, row: 12 -> 5; 2, 3 and 4 all divide 12
NAMES = ("CopyToParallel", "ReduceFromParallel", "column_parallel_linear",
         "row_parallel_linear")
PARTS = ("f", "g", "column", "row", "mlp")
TITLES = {
    "f": "f (CopyToParallel): identity forward, all-reduce backward",
    "g": "g (ReduceFromParallel): all-reduce forward, identity backward",
    "column": "column-parallel layer: output slice, input, weight and bias gradients",
    "row": "row-parallel layer: output (bias once), input, weight and bias gradients",
    "mlp": "column -> GELU -> row equals the dense MLP, forward and backward",
    "trace": "the trace: only the all-reduces f and g need (MLP: 1 forward, 1 backward)",
}
# The collectives each part may record: (forward ops, backward ops).
EXPECTED_OPS = {
    "f": ([], ["all_reduce"]),
    "g": (["all_reduce"], []),
    "column": ([], ["all_reduce"]),
    "row": (["all_reduce"], []),
    "mlp": (["all_reduce"], ["all_reduce"]),
}
PART_NAMES = {"f": "f", "g": "g", "column": "the column-parallel layer",
              "row": "the row-parallel layer", "mlp": "the MLP"}


# --------------------------------------------------------------------------- in the ranks
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


# --------------------------------------------------------------------------- in the parent
HINTS = {
    "f-forward-sums": "f's forward must be the identity: every rank already holds all of X. "
                      "The all-reduce belongs in f's backward.",
    "f-backward-identity": "each rank's branch holds only part of dL/dX (its own columns' "
                           "contribution): f's backward must all-reduce the gradient.",
    "g-forward-identity": "g's forward must sum the ranks' partial products: "
                          "mt.comm.all_reduce(x, axis).",
    "g-backward-sums": "g's backward is the identity: dL/dY is already the same on every "
                       "rank, and d(sum)/d(term) = 1. All-reducing it multiplies it by t.",
    "bias-before-sum": "the bias was added before the reduction, so the all-reduce counted it "
                       "t times: add it once, after g.",
    "bias-missing": "the output is short by exactly the bias: add it, once, after g.",
    "bias-not-every-rank": "add the whole bias on every rank, after g: then every rank's copy "
                           "gets the same gradient and stays the same.",
}
GENERIC_HINTS = {
    "f": "forward: return x unchanged; backward: return (mt.comm.all_reduce(grad, ctx.axis), "
         "None).",
    "g": "forward: return mt.comm.all_reduce(x, axis); backward: return (grad, None).",
    "column": "Y_r = F.linear(f(x), weight, bias), with f = copy_to_parallel.",
    "row": "Y = g(F.linear(x, weight)) + bias, with g = reduce_from_parallel.",
    "mlp": "get the column and row layers right first (see above): the MLP only composes "
           "them, with GELU in between and no communication of its own.",
}


def _judge_numbers(part, name, outcomes) -> Check:
    worst = 0.0
    for t, per_rank in outcomes:
        for rank, results in enumerate(per_rank):
            res = results[part]
            if "exception" in res:
                return exception_check(name, t, rank, res["exception"])
            hint = next((HINTS[k] for k in res["mistakes"]), GENERIC_HINTS[part])
            if res["problem"]:
                return Check(name, False, f"t={t}, rank {rank}: {res['problem']}", rank=rank,
                             hint=hint)
            for tensor, error in res["errors"].items():
                if error > TOLERANCE:
                    return Check(name, False, f"t={t}, rank {rank}: {tensor} is off by up to "
                                 f"{error:.3g}", rank=rank, tensor=tensor, max_error=error,
                                 hint=hint)
                worst = max(worst, error)
    sizes = ", ".join(str(t) for t, _ in outcomes)
    return Check(name, True, f"t = {sizes}: largest error {worst:.1e}", max_error=worst)


def _judge_trace(name, outcomes) -> Check:
    for t, per_rank in outcomes:
        for rank, results in enumerate(per_rank):
            for part in PARTS:
                res = results[part]
                if "exception" in res:
                    return Check(name, False, f"not checked: {PART_NAMES[part]} raised an "
                                 f"error (see above)", rank=rank)
                for phase, got, want in zip(("forward", "backward"), res["ops"],
                                            EXPECTED_OPS[part], strict=True):
                    if got == want:
                        continue
                    said = ", ".join(op.replace("_", "-") for op in got) or "nothing"
                    expected = ", ".join(op.replace("_", "-") for op in want) or "nothing"
                    numbers_ok = not res["problem"] and all(
                        e <= TOLERANCE for e in res["errors"].values())
                    return Check(name, False, f"t={t}, rank {rank}: {PARTS_LABEL[part]} "
                                 f"{phase} recorded {said}; expected {expected}", rank=rank,
                                 hint=_trace_hint(part, phase, got, want, numbers_ok))
    return Check(name, True, "f: 1 all-reduce backward, g: 1 forward, MLP: 1 + 1, on every rank")


PARTS_LABEL = {"f": "f's", "g": "g's", "column": "the column layer's",
               "row": "the row layer's", "mlp": "the MLP's"}


def _trace_hint(part, phase, got, want, numbers_ok) -> str:
    if not got and numbers_ok:
        return ("no collective was recorded: communicate through mt.comm.all_reduce (it "
                "leaves an event in the trace; torch.distributed called directly does not)")
    if not got:
        return HINTS["f-backward-identity" if phase == "backward" else "g-forward-identity"]
    if any(op != "all_reduce" for op in got):
        return "f and g need nothing but mt.comm.all_reduce"
    if part in ("f", "column") and phase == "forward":
        return HINTS["f-forward-sums"]
    if part in ("g", "row") and phase == "backward":
        return HINTS["g-backward-sums"]
    if len(got) > len(want):
        return "one all-reduce per mapping and pass: the layers only call f or g once each"
    return GENERIC_HINTS[part]


def run(module) -> list[Check]:
    return grade_in_parts(module, NAMES, TITLES, WORLD_SIZES, _in_rank, _judge_numbers,
                          _judge_trace)
