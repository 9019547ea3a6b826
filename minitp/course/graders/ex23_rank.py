"""ex23 on the ranks: one device's FP8 step written here by hand (the reference), the
grader's own (a) and (b) to judge (c) alone, and the learner's parts run on a dp = 2 ×
tp = 2 mesh, each result, blank or crash kept for the parent (ex23.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...rules.fp8_groups import amax_axes
from ...runtime import comm
from ...runtime._device import device
from ...runtime.mesh import Mesh
from .base import call_kept

DP, TP = 2, 2
B, S, C, H = 2, 4, 8, 16  # rows per dp rank, sequence, width, hidden (all of it)
TOLERANCE = 1e-10
ROLES, AXES = ("input", "weight", "grad"), ("dp", "tp")
CASES = [(layer, sp) for sp in (False, True) for layer in ("column", "row")]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def rule(layer: str, sp: bool) -> dict:
    """The smallest right answer to (b): the library's rule on a dp × tp mesh, with the
    weight also split over dp (ZeRO-3's pieces, each cast before the gather)."""
    return {role: tuple(a for a in AXES if a in amax_axes(layer, role, "tensorwise", sp)
                        or (role == "weight" and a == "dp")) for role in ROLES}


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
        got, why = call_kept(fns.shared_amax, mine.clone(), axes)
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
    # ZeRO-3: each dp rank keeps 1/dp of its tp shard's rows
    piece = lambda t: t.chunk(DP, dim=0)[mesh.dp.rank]  # noqa: E731
    xs = x[rows][:, seq].clone().requires_grad_()
    w1s = piece(w1[cols]).clone().requires_grad_()
    w2s = piece(w2[:, cols]).clone().requires_grad_()
    phase[0] = "fwd"
    y, why = call_kept(fns.mlp, xs, w1s, w2s, mesh, sp)
    if why is None:
        phase[0] = "bwd"
        _, why = call_kept(lambda: (y * r[rows][:, seq]).sum().backward())
    if why:
        return {"raised": why, "log": list(log)}
    pairs = {"output": (y, ref["y"][rows][:, seq]), "input's gradient": (xs.grad,
             ref["x"][rows][:, seq]), "W1's gradient": (w1s.grad, piece(ref["w1"][cols])),
             "W2's gradient": (w2s.grad, piece(ref["w2"][:, cols]))}
    errors = {k: ((a.detach() - b).abs().max() / b.abs().max()).item()
              if a is not None and a.shape == b.shape else float("inf")
              for k, (a, b) in pairs.items()}
    return {"errors": errors, "log": list(log), "amax": ref["amax"]}


def _in_rank(fns):
    mesh = Mesh(dp=DP, tp=TP)
    out = {"a": _part_a(fns, mesh), "b": {}}
    for layer, sp in CASES:
        got, why = call_kept(fns.amax_groups, layer, sp)
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
