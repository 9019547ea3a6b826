"""Checks for ex05: sequence parallelism's pair of autograd Functions, and the
partial-gradient sum.

At t = 2 and 4 ranks, in float64:

* each Function's forward and backward equal the library's mapping
  (`minitp.tensor_parallel.mappings.gather_from_sequence(grad_is_partial=True)` /
  `reduce_scatter_to_sequence`), and
  each makes exactly one collective of the right kind in each direction;
* an MLP block with sequence parallelism — LayerNorm on this rank's positions,
  the learner's all-gather, column-parallel fc, GELU, row-parallel proj, the
  learner's reduce-scatter, bias and residual — equals the plain block on the
  whole sequence: its output and every gradient (the LayerNorm's and the bias's
  summed over the ranks);
* `sync_partial_grads` leaves every rank with the sum of the ranks' gradients,
  using all-reduces only.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...runtime import comm, trace
from ...runtime.launch import launch
from ...runtime.mesh import world
from ...tensor_parallel import mappings
from .base import Check, run_per_size

WORLD_SIZES = (2, 4)
TOLERANCE = 1e-12  # float64
B, T, H = 2, 8, 6  # batch, sequence (2 and 4 divide it), hidden
PAIRS = {
    "all_gather_from_sequence": ("all_gather", "reduce_scatter", (B, T // 2, H)),
    "reduce_scatter_to_sequence": ("reduce_scatter", "all_gather", (B, T, H)),
}


def _ops_since(first):
    return [e.op for e in trace.events()[first:]]


def _library(x, name, axis):
    """The library's mapping that the learner's `name` must equal."""
    if name == "all_gather_from_sequence":  # each rank's gradient is a partial sum
        return mappings.gather_from_sequence(x, axis, grad_is_partial=True)
    return mappings.reduce_scatter_to_sequence(x, axis)


def _pair(learner, name, axis):
    """The learner's Function against the library's, forward and backward."""
    t = axis.size
    shape = (B, T // t, H) if name == "all_gather_from_sequence" else (B, T, H)
    generator = torch.Generator().manual_seed(500 + axis.rank)  # each rank its own data
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    out_shape = (B, T, H) if name == "all_gather_from_sequence" else (B, T // t, H)
    upstream = torch.randn(out_shape, generator=generator, dtype=torch.float64)
    with trace.paused():
        x_ref = x.clone().requires_grad_()
        expected = _library(x_ref, name, axis)
        expected.backward(upstream)
    x_mine = x.clone().requires_grad_()
    entry = {}
    first = len(trace.events())
    try:
        got = getattr(learner, name)(x_mine, axis)
    except NotImplementedError as exc:
        return {"missing": ("forward", str(exc))}
    entry["forward_ops"] = _ops_since(first)
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        shown = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        entry["problem"] = f"forward returned {shown}, expected shape {tuple(expected.shape)}"
        return entry
    entry["forward_error"] = (got - expected).abs().max().item()
    first = len(trace.events())
    try:
        got.backward(upstream)
    except NotImplementedError as exc:
        entry["missing"] = ("backward", str(exc))
        return entry
    entry["backward_ops"] = _ops_since(first)
    if x_mine.grad is None or x_mine.grad.shape != x_ref.grad.shape:
        entry["problem"] = "backward returned no gradient of the input's shape"
        return entry
    entry["backward_error"] = (x_mine.grad - x_ref.grad).abs().max().item()
    return entry


def _block(learner, axis):
    """A sequence-parallel MLP block built with the learner's pair, against the plain block."""
    t, r = axis.size, axis.rank
    torch.manual_seed(0)  # the same plain block, input and upstream gradient on every rank
    ln, fc, proj = nn.LayerNorm(H), nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
    for module in (ln, fc, proj):
        module.double()
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p is ln.weight else 0.0))
    x = torch.randn(B, T, H, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(B, T, H, dtype=torch.float64)
    y = x + proj(F.gelu(fc(ln(x))))
    y.backward(upstream)

    mine = slice(r * T // t, (r + 1) * T // t)  # this rank's positions
    ln_s = copy.deepcopy(ln)
    ln_s.zero_grad(set_to_none=True)
    fc_w = fc.weight.detach().chunk(t, 0)[r].clone().requires_grad_()  # column-parallel
    fc_b = fc.bias.detach().chunk(t, 0)[r].clone().requires_grad_()
    proj_w = proj.weight.detach().chunk(t, 1)[r].clone().requires_grad_()  # row-parallel
    proj_b = proj.bias.detach().clone().requires_grad_()  # whole, added after the reduction
    x_s = x.detach()[:, mine].clone().requires_grad_()
    try:
        h = learner.all_gather_from_sequence(ln_s(x_s), axis)  # (B, T, H)
        partial = F.linear(F.gelu(F.linear(h, fc_w, fc_b)), proj_w)  # (B, T, H), one term
        y_s = x_s + learner.reduce_scatter_to_sequence(partial, axis) + proj_b  # (B, T/t, H)
        y_s.backward(upstream[:, mine])
    except NotImplementedError as exc:
        return {"missing": ("pair", str(exc))}
    except Exception as exc:  # noqa: BLE001 - a wrong shape fails alike on every rank
        return {"problem": f"the block raised {type(exc).__name__}: {exc}"}
    if y_s.shape != (B, T // t, H):
        return {"problem": f"the block's output has shape {tuple(y_s.shape)}, expected "
                           f"{(B, T // t, H)}: this rank's positions only"}
    with trace.paused():  # the reference sum of the partial gradients (not the learner's)
        partial_sums = {name: comm.all_reduce(p.grad, axis) for name, p in
                        (("LayerNorm weight", ln_s.weight), ("LayerNorm bias", ln_s.bias),
                         ("proj bias", proj_b))}
    pairs = {
        "output": (y_s, y.detach()[:, mine]),
        "grad of the input": (x_s.grad, x.grad[:, mine]),
        "grad of fc weight": (fc_w.grad, fc.weight.grad.chunk(t, 0)[r]),
        "grad of fc bias": (fc_b.grad, fc.bias.grad.chunk(t, 0)[r]),
        "grad of proj weight": (proj_w.grad, proj.weight.grad.chunk(t, 1)[r]),
        "grad of LayerNorm weight (summed)": (partial_sums["LayerNorm weight"], ln.weight.grad),
        "grad of LayerNorm bias (summed)": (partial_sums["LayerNorm bias"], ln.bias.grad),
        "grad of proj bias (summed)": (partial_sums["proj bias"], proj.bias.grad),
    }
    errors = {}
    for name, (got, expected) in pairs.items():
        if got is None:
            return {"problem": f"{name.split(' (')[0]} is missing (no gradient reached it)"}
        errors[name] = (got.detach() - expected).abs().max().item()
    return {"errors": errors}


def _sync(learner, axis):
    """sync_partial_grads on known per-rank gradients against their sum."""
    shapes = [(5,), (3, 4), (2,)]
    generator = torch.Generator().manual_seed(700 + axis.rank)
    params = [nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator, dtype=torch.float64)
    with trace.paused():
        expected = [comm.all_reduce(p.grad, axis) for p in params]
    first = len(trace.events())
    try:
        learner.sync_partial_grads(params, axis)
    except NotImplementedError as exc:
        return {"missing": ("sync", str(exc))}
    return {"ops": _ops_since(first),
            "error": max((p.grad - e).abs().max().item() for p, e in zip(params, expected,
                                                                           strict=True))}


def _in_rank(learner):
    axis = world()
    found = {name: _pair(learner, name, axis) for name in PAIRS}
    found["block"] = _block(learner, axis)
    found["sync"] = _sync(learner, axis)
    return found


class _Learner:
    """The learner's three functions, travelling to the ranks together."""

    def __init__(self, module):
        self.all_gather_from_sequence = module.all_gather_from_sequence
        self.reduce_scatter_to_sequence = module.reduce_scatter_to_sequence
        self.sync_partial_grads = module.sync_partial_grads


def run(module) -> list[Check]:
    def launch_at(t):
        return launch(_in_rank, t, _Learner(module), timeout=10.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, blank=_blank,
                        what="the sequence-parallel pair", size="t")


def _names(t) -> list[str]:
    return [f"t={t}: all-gather pair (fwd all-gather, bwd reduce-scatter)",
            f"t={t}: reduce-scatter pair (fwd reduce-scatter, bwd all-gather)",
            f"t={t}: a sequence-parallel MLP block equals the plain one",
            f"t={t}: sync_partial_grads sums the gradients over the ranks"]


def _judge(t, names, per_rank) -> list[Check]:
    return [_pair_check(names[0], per_rank, "all_gather_from_sequence"),
            _pair_check(names[1], per_rank, "reduce_scatter_to_sequence"),
            _block_check(names[2], per_rank),
            _sync_check(names[3], per_rank)]


def _blank(per_rank, checks) -> str | None:
    """Only when every part is blank: one written part is worth testing at every size."""
    return "nothing is written yet" if all("not written yet" in c.detail for c in checks) else None


def _a(op) -> str:
    name = op.replace("_", "-")
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _pair_check(name, per_rank, pair) -> Check:
    forward_op, backward_op, _ = PAIRS[pair]
    worst = 0.0
    for rank, found in enumerate(per_rank):
        entry = found[pair]
        missing = entry.get("missing")
        if missing:
            return Check(name, False, f"the {missing[0]} of {pair} is not written yet",
                         hint=missing[1])
        if "problem" in entry:
            return Check(name, False, f"rank {rank}: {entry['problem']}", rank=rank,
                         hint="the forward takes (B, T/t, h) to (B, T, h) for the all-gather, "
                              "and the reverse for the reduce-scatter; backward the reverse")
        if entry["forward_ops"] != [forward_op]:
            shown = ", ".join(entry["forward_ops"]) or "nothing"
            return Check(name, False, f"rank {rank}'s forward called {shown}", rank=rank,
                         hint=f"the forward is exactly one mt.comm.{forward_op} along dim 1")
        if entry["backward_ops"] != [backward_op]:
            shown = ", ".join(entry["backward_ops"]) or "nothing"
            return Check(name, False, f"rank {rank}'s backward called {shown}", rank=rank,
                         hint=f"the backward of {_a(forward_op)} is one "
                              f"mt.comm.{backward_op} along dim 1 (its adjoint)")
        for key, what in (("forward_error", "output"), ("backward_error", "input gradient")):
            if entry[key] > TOLERANCE:
                return Check(name, False, f"rank {rank}: {what} off by up to {entry[key]:.3g}",
                             rank=rank, tensor=what, max_error=entry[key],
                             hint="gather and scatter along the sequence, dim=1 (SEQ_DIM), "
                                  "not the last dimension")
            worst = max(worst, entry[key])
    return Check(name, True, f"largest error {worst:.1e}; one {forward_op.replace('_', '-')} "
                 f"forward, one {backward_op.replace('_', '-')} backward", max_error=worst)


def _block_check(name, per_rank) -> Check:
    worst = 0.0
    for rank, found in enumerate(per_rank):
        entry = found["block"]
        if "missing" in entry:
            return Check(name, False, "not checked: the pair is not written yet",
                         hint=entry["missing"][1])
        if "problem" in entry:
            return Check(name, False, f"rank {rank}: {entry['problem']}", rank=rank,
                         hint="check the pair's shapes: all-gather (B, T/t, h) -> (B, T, h), "
                              "reduce-scatter (B, T, h) -> (B, T/t, h)")
        for tensor, error in entry["errors"].items():
            if error > TOLERANCE:
                return Check(name, False, f"rank {rank}: {tensor} off by up to {error:.3g}",
                             rank=rank, tensor=tensor, max_error=error,
                             hint="the pair's forward and backward are each other's adjoints: "
                                  "all-gather <-> reduce-scatter, along dim 1")
            worst = max(worst, error)
    return Check(name, True, f"output and every gradient within {worst:.1e}", max_error=worst)


def _sync_check(name, per_rank) -> Check:
    worst = 0.0
    for rank, found in enumerate(per_rank):
        entry = found["sync"]
        if "missing" in entry:
            return Check(name, False, "sync_partial_grads is not written yet",
                         hint=entry["missing"][1])
        others = sorted({op for op in entry["ops"] if op != "all_reduce"})
        if others or not entry["ops"]:
            shown = ", ".join(others) or "no collective at all"
            return Check(name, False, f"rank {rank} used {shown}", rank=rank,
                         hint="each rank's gradient is a partial sum: mt.comm.all_reduce "
                              "(sum) gives every rank the total")
        if entry["error"] > TOLERANCE:
            return Check(name, False, f"rank {rank}: gradients off by up to "
                         f"{entry['error']:.3g} from the sum over ranks", rank=rank,
                         tensor="grad", max_error=entry["error"],
                         hint="write the summed values back into each p.grad in place "
                              "(g.copy_(...)), in the same order you flattened them")
        worst = max(worst, entry["error"])
    count = len(per_rank[0]["sync"]["ops"])
    how = "one all-reduce" if count == 1 else f"{count} all-reduces"
    return Check(name, True, f"largest error {worst:.1e}, {how} for 3 parameters",
                 max_error=worst)
