"""Checks for ex21: the amax groups of a tensor-parallel FP8 MLP, with and without SP.

One launch of 4 ranks, a dp = 2 × tp = 2 mesh, float64. The reference is one device's
FP8 step on the whole batch, written here by hand (each cast scaled by the whole tensor's
amax, the backward's GEMMs from the casts), never the exercise's code:

* (a) `shared_amax` over dp, over tp and over both, on tensors whose largest magnitude is
  a negative entry. Named: a local scale (each rank its own amax), a sum (all_reduce's
  default op), the largest signed value, a reduction over the first axis only;
* (b) `amax_groups` for both layers with and without SP, against the rule
  (`minitp.rules.fp8_groups`, the library's, on a mesh without cp). Named: no reduction
  where the tensor is split (a local scale), a weight reduced over dp where tp splits it
  (the wrong group: Megatron-LM PR #442), SP's column input left without tp
  (TransformerEngine PR #74), a reduction over an axis that holds copies (not needed);
* (c) `gradient_gemms` (FP8Linear's backward), with the grader's (a) and (b) installed in
  their place, so it is judged alone: one forward and backward with and without SP, the
  output, the input's gradient and both weights' (summed over dp) against one device.
  Every `quantize` call is watched; named: the output gradient never cast (a forgotten
  backward scale), cast to e4m3, cast with this rank's own amax (a local scale) or another;
* (d) the learner's own (a), (b) and (c) together, the same step: its largest error
  measured against one device, the drift a wrong group causes.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ...rules.fp8_groups import amax_axes
from ...runtime import comm
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from .base import Check, run_per_size
from .ex09 import _call  # the learner's function called, its blank or crash kept

WORLD_SIZES = (4,)
DP, TP = 2, 2
B, S, C, H = 2, 4, 8, 16  # rows per dp rank, sequence, width, hidden (all of it)
TOLERANCE, TIMEOUT = 1e-10, 60.0
ROLES, AXES = ("input", "weight", "grad"), ("dp", "tp")
CASES = [(layer, sp) for sp in (False, True) for layer in ("column", "row")]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
NAMES = ["(a) shared_amax: the largest |value| over the ranks of the given axes",
         "(b) amax_groups: the axes each cast's amax is reduced over, with and without SP",
         "(c) gradient_gemms: the output gradient cast to e5m2 with its shared scale, both "
         "GEMMs of the backward from FP8 operands",
         "(d) your (a), (b) and (c) together: the FP8 MLP on dp = 2 × tp = 2 equals one "
         "device's FP8 step"]
HINT_C = ("the gradient has a cast of its own, in its own format, with the amax of the whole "
          "gradient: quantize(grad, shared_amax(grad, axes), E5M2); then "
          "∂x = g_q W_q and ∂W = g_qᵀ x_q")


def rule(layer: str, sp: bool) -> dict:
    """The right answer to (b): the library's rule, on a dp × tp mesh."""
    return {role: tuple(a for a in amax_axes(layer, role, "tensorwise", sp) if a in AXES)
            for role in ROLES}


def _q(t, dtype):
    """One device's cast: t's own amax, the whole tensor."""
    largest = torch.finfo(dtype).max
    scale = largest / t.abs().max()
    return (t * scale).clamp(-largest, largest).to(dtype).to(t.dtype) / scale


def reference(x, w1, w2, r) -> dict:
    """One device's FP8 step on the whole batch: the output, every gradient, and the amax
    of each output gradient the backward casts."""
    xq, w1q, w2q = _q(x, E4M3), _q(w1, E4M3), _q(w2, E4M3)
    h = (xq @ w1q.T).requires_grad_()
    a = F.gelu(h)
    aq = _q(a.detach(), E4M3)
    y = aq @ w2q.T
    g2 = _q(r, E5M2)
    da = g2 @ w2q
    a.backward(da)  # through GELU only
    g1 = _q(h.grad, E5M2)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    return {"y": y, "x": g1 @ w1q, "w1": flat(g1).T @ flat(xq), "w2": flat(g2).T @ flat(aq),
            "amax": {"row": r.abs().max().item(), "column": h.grad.abs().max().item()}}


def _grader_shared_amax(t, axes):
    amax = t.detach().abs().max()
    for axis in axes:
        amax = comm.all_reduce(amax, axis, op="max")
    return amax


def _grader_groups(layer, sequence_parallel):
    return rule(layer, sequence_parallel)


def _part_a(fns, mesh):
    """(a) on every axis set: what the learner's function gave, and what each usual
    mistake would give (every rank's tensor is drawn from its rank, known to all)."""
    def tensor(rank):
        t = torch.randn(3, 5, generator=torch.Generator().manual_seed(10 + rank),
                        dtype=torch.float64)
        t[0, 0] = -10.0 * (rank + 1)  # the largest magnitude is negative
        return t.to(device())
    mine = tensor(mesh.rank)
    found = []
    for names in (("dp",), ("tp",), ("dp", "tp")):
        axes = tuple(getattr(mesh, n) for n in names)
        group = {mesh.rank}
        for axis in axes:
            group = {r for g in group for r in _same_place(mesh, axis, g)}
        got, why = _call(fns.shared_amax, mine.clone(), axes)
        if why:
            return {"raised": why}
        first = _same_place(mesh, axes[0], mesh.rank)
        found.append({
            "names": names, "got": float(got) if torch.is_tensor(got) and got.numel() == 1
            else None, "right": max(tensor(r).abs().max().item() for r in group),
            "local": mine.abs().max().item(),
            "sum": sum(tensor(r).abs().max().item() for r in group),
            "signed": max(tensor(r).max().item() for r in group),
            "first": max(tensor(r).abs().max().item() for r in first)})
    return {"found": found}


def _same_place(mesh, axis, rank):
    """The global ranks of `axis`'s group that holds global rank `rank`."""
    step = TP if axis.name == "dp" else 1
    base = rank - (rank // step % axis.size) * step
    return {base + i * step for i in range(axis.size)}


def _run_mlp(fns, mesh, sp, log, phase):
    """One step of the learner's MLP on this rank's piece: its errors from one device."""
    g = torch.Generator().manual_seed(7)
    x, w1 = torch.randn(DP * B, S, C, generator=g), torch.randn(H, C, generator=g) * 0.3
    w2, r = torch.randn(C, H, generator=g) * 0.3, torch.randn(DP * B, S, C, generator=g) * 1e-3
    x, w1, w2, r = (t.double().to(device()) for t in (x, w1, w2, r))
    ref = reference(x, w1, w2, r)
    rows = slice(mesh.dp.rank * B, (mesh.dp.rank + 1) * B)
    seq = slice(mesh.tp.rank * S // TP, (mesh.tp.rank + 1) * S // TP) if sp else slice(None)
    cols = slice(mesh.tp.rank * H // TP, (mesh.tp.rank + 1) * H // TP)
    xs = x[rows][:, seq].clone().requires_grad_()
    w1s, w2s = w1[cols].clone().requires_grad_(), w2[:, cols].clone().requires_grad_()
    phase[0] = "fwd"
    y, why = _call(fns.mlp, xs, w1s, w2s, mesh, sp)
    if why is None:
        phase[0] = "bwd"
        _, why = _call(lambda: (y * r[rows][:, seq]).sum().backward())
    if why:
        return {"raised": why, "log": list(log)}
    grads = {"w1": comm.all_reduce(w1s.grad, mesh.dp), "w2": comm.all_reduce(w2s.grad, mesh.dp)}
    pairs = {"output": (y, ref["y"][rows][:, seq]), "input's gradient": (xs.grad,
             ref["x"][rows][:, seq]), "W1's gradient": (grads["w1"], ref["w1"][cols]),
             "W2's gradient": (grads["w2"], ref["w2"][:, cols])}
    errors = {k: ((a.detach() - b).abs().max() / b.abs().max()).item()
              if a is not None and a.shape == b.shape else float("inf")
              for k, (a, b) in pairs.items()}
    return {"errors": errors, "log": list(log), "amax": ref["amax"]}


def _in_rank(fns):
    mesh = Mesh(dp=DP, tp=TP)
    out = {"a": _part_a(fns, mesh), "b": {}}
    for layer, sp in CASES:
        got, why = _call(fns.amax_groups, layer, sp)
        if why is None and not isinstance(got, dict):
            why = ("returned", f"a {type(got).__name__}, not a dict role -> axis names")
        out["b"][(layer, sp)] = {"raised": why} if why else {
            role: tuple(got.get(role, ())) for role in ROLES}
    functions = (fns.FP8Linear.forward, fns.FP8Linear.backward, fns.gradient_gemms, fns.mlp)
    spaces = {id(f.__globals__): f.__globals__ for f in functions}.values()
    saved = [dict(space) for space in spaces]
    log, phase = [], ["fwd"]
    original = fns.quantize

    def watched(t, amax, dtype):
        log.append((phase[0], dtype, float(amax), t.detach().abs().max().item()))
        return original(t, amax, dtype)

    for space in spaces:  # (c): the grader's (a) and (b), every cast watched
        space.update(shared_amax=_grader_shared_amax, amax_groups=_grader_groups,
                     quantize=watched)
    try:
        out["c"] = {sp: _run_mlp(fns, mesh, sp, log, phase) for sp in (False, True)
                    if not log.clear()}
    finally:
        for space, before in zip(spaces, saved, strict=True):
            space.update(before)
    out["d"] = {sp: _run_mlp(fns, mesh, sp, [], ["fwd"]) for sp in (False, True)}
    return out


def run(module) -> list[Check]:
    fns = SimpleNamespace(shared_amax=module.shared_amax, amax_groups=module.amax_groups,
                          FP8Linear=module.FP8Linear, mlp=module.mlp,
                          gradient_gemms=module.gradient_gemms, quantize=module.quantize)
    return run_per_size(WORLD_SIZES, lambda n: list(NAMES),
                        lambda n: launch(_in_rank, n, fns, timeout=TIMEOUT), _judge,
                        what="the amax groups", size="n")


def _raised(function, why, hint):
    kind, message = why
    if kind == "blank":
        return False, f"{function} is not written yet", message or hint
    verb = "returned" if kind == "returned" else "raised"
    return False, f"{function} {verb} {message}", hint


def _judge(n, names, per_rank) -> list[Check]:
    parts = (_judge_a, _judge_b, _judge_c, _judge_d)
    checks = []
    for name, part in zip(names, parts, strict=True):
        for rank, record in enumerate(per_rank):
            passed, detail, hint = part(record)
            if not passed:
                checks.append(Check(name, False, detail, rank=rank, hint=hint))
                break
        else:
            checks.append(Check(name, True, part(per_rank[0])[1]))
    return checks


def _judge_a(record):
    a = record["a"]
    if "raised" in a:
        return _raised("shared_amax", a["raised"], "an amax reduced with MAX")
    for f in a["found"]:
        over, got = " and ".join(f["names"]), f["got"]
        if got is not None and abs(got - f["right"]) <= 1e-12 * f["right"]:
            continue
        mistakes = {"local": "this rank's own amax, not reduced: a local scale",
                    "sum": "the sum of the ranks' amaxes: all_reduce sums unless told "
                           "op=\"max\"", "signed": "the largest value, not the largest "
                                                   "magnitude: a negative entry is larger here",
                    "first": f"reduced over {f['names'][0]} only: reduce over every axis given"}
        why = next((says for key, says in mistakes.items()
                    if got is not None and abs(got - f[key]) <= 1e-12 * abs(f[key])),
                   f"got {got}, the whole tensor's amax is {f['right']}")
        return False, f"over {over}: {why}", "the largest |value| of every rank's piece: " \
            "t.abs().max(), then all_reduce(..., op=\"max\") over each axis"
    return True, "over dp, tp and both: the largest magnitude of every rank's piece", ""


def _judge_b(record):
    for (layer, sp), got in record["b"].items():
        if "raised" in got:
            return _raised("amax_groups", got["raised"], "which axes split each tensor?")
        want = rule(layer, sp)
        for role in ROLES:
            mine, right = got[role], want[role]
            if sorted(mine) == sorted(right):  # in any order
                continue
            where = f"{layer} layer{', SP' if sp else ''}, {role}: {mine}, expected {right}"
            missing = [a for a in right if a not in mine]
            extra = [a for a in mine if a not in right]
            if role == "weight" and "dp" in extra and "tp" in missing:
                return False, f"{where}: the wrong group — the weight is split over tp and " \
                    "copied over dp (Megatron-LM PR #442: its FP8 runs of a 40B model at " \
                    "tp = 8 diverged after about 1,000 iterations)", "which axis holds the " \
                    "other pieces of W?"
            if not mine:
                return False, f"{where}: a local scale — every rank of {right} holds another " \
                    "piece and would scale it by its own amax", "a split tensor shares one amax"
            if sp and role == "input" and layer == "column" and "tp" in missing:
                return False, f"{where}: under SP the input is cast on this rank's sequence " \
                    "shard, before the all-gather (TransformerEngine PR #74)", "who holds the " \
                    "other positions of the sequence?"
            if missing:
                return False, f"{where}: {', '.join(missing)} holds other pieces of it", \
                    "the data-parallel ranks hold other rows of every activation and gradient"
            return False, f"{where}: not needed — {', '.join(extra)} holds copies of it: the " \
                "reduction changes nothing and costs a collective each step", "reduce only " \
                "over the axes that split the tensor as its cast sees it"
    return True, "both layers, with and without SP: the rule's axes, no more", ""


def _judge_c(record):
    for sp, run_ in record["c"].items():
        label = "with SP" if sp else "without SP"
        if "raised" in run_:
            return _raised("gradient_gemms", run_["raised"], HINT_C)
        casts = [entry for entry in run_["log"] if entry[0] == "bwd"]
        if not casts:
            return False, f"{label}: the output gradient was never cast: the backward scale " \
                "is forgotten (the backward GEMMs read it in full precision)", HINT_C
        for (_, dtype, amax, local), layer in zip(casts, ("row", "column"), strict=False):
            whole = run_["amax"][layer]
            if dtype != E5M2:
                return False, f"{label}: the {layer} layer's gradient cast to {dtype}: " \
                    "gradients take e5m2, the wider range", HINT_C
            if abs(amax - whole) > 1e-12 * whole:
                why = ("this rank's own amax, a local scale" if abs(amax - local) <= 1e-12 *
                       local else f"amax {amax:.6g}")
                return False, f"{label}: the {layer} layer's gradient scaled by {why}; the " \
                    f"whole gradient's amax is {whole:.6g}", HINT_C
        tensor, error = max(run_["errors"].items(), key=lambda item: item[1])
        if error > TOLERANCE:
            return False, f"{label}: the {tensor} is off by {error:.3g} (relative) though " \
                "every cast was right: the GEMMs", HINT_C
    return True, "with and without SP, every output and gradient as one device's", ""


def _judge_d(record):
    worst = {}
    for sp, run_ in record["d"].items():
        label = "with SP" if sp else "without SP"
        if "raised" in run_:
            return False, f"not checked: {label}, {_raised('your MLP', run_['raised'], '')[1]}", \
                "write (a), (b) and (c) first"
        tensor, worst[label] = max(run_["errors"].items(), key=lambda item: item[1])
        if worst[label] > TOLERANCE:
            return False, f"{label}: the {tensor} differs from one device's by " \
                f"{worst[label]:.3g} (relative): the drift of a scale not shared", \
                "see (a) and (b)"
    return True, ", ".join(f"{k} largest error {v:.1e}" for k, v in worst.items()), ""
