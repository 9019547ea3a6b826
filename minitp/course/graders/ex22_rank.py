"""ex22 on the ranks: dp = 4, float64. Every rank's local gradients are drawn from its rank
(known to all), so each rank can work out what one device would orthogonalise and what each
usual mistake would, and keep it beside what the learner's code returned (ex22.py judges)."""

from __future__ import annotations

import torch

from ...calc.footprint.muon import lpt_owners, ns_flops
from ...runtime import trace
from ...runtime._device import device
from ...runtime.mesh import Mesh
from .base import call_kept

DP = 4
# (rows, cols) of the matrices: rows divisible by DP; costs unequal, so a careless map is
# unbalanced (round robin puts the two largest on one rank)
SHAPES = [(16, 12), (8, 6), (16, 12), (4, 8), (12, 4), (8, 16), (4, 4), (8, 8)]
# cost lists and rank counts for (a): ties included, and more ranks than matrices
COSTS = [([ns_flops(r, c) for r, c in SHAPES], DP), ([5, 5, 4, 4, 3, 3, 2, 2], 3),
         ([7, 1, 1, 1, 1, 1, 1], 2), ([3, 9, 3], 4), ([10, 8, 8, 6, 5, 4, 4, 3, 2, 1], 3)]


def _local(rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(r, c, generator=gen, dtype=torch.float64).to(device())
            for r, c in SHAPES]


def _ns(x):
    from ...optim.newton_schulz import newton_schulz
    return newton_schulz(x)


def _candidates(rank: int, owners: list[int]) -> dict:
    """Per matrix, this rank's rows of: the right update and each usual mistake's."""
    local = [_local(r) for r in range(DP)]
    summed = [sum(g[j] for g in local) for j in range(len(SHAPES))]
    out = {key: [] for key in ("right", "partial", "patchwork", "shard")}
    for j, home in enumerate(owners):
        def rows(x):
            return x.chunk(DP)[rank]
        patch = local[home][j].clone()
        patch.chunk(DP)[home].copy_(summed[j].chunk(DP)[home])  # #8090: only its rows summed
        out["right"].append(rows(_ns(summed[j])))
        out["partial"].append(rows(_ns(local[home][j])))
        out["patchwork"].append(rows(_ns(patch)))
        out["shard"].append(_ns(rows(summed[j])))
    return out


def _run_update(fns, mesh, owners) -> dict:
    """The learner's owner_update once, with newton_schulz and the collectives watched."""
    rank = mesh.dp.rank
    local = _local(rank)
    mine = [sum(g[j] for g in (_local(r) for r in range(DP))).chunk(DP)[rank].clone()
            for j in range(len(SHAPES))]
    space, calls = fns.owner_update.__globals__, []
    original = space.get("newton_schulz")

    def watched(x, *args, **kwargs):
        calls.append(tuple(x.shape))
        return _ns(x)

    space["newton_schulz"] = watched
    before = len(trace.events())
    try:
        got, why = call_kept(fns.owner_update, mine, [g.clone() for g in local], list(owners),
                             mesh.dp)
    finally:
        space["newton_schulz"] = original
    if why:
        return {"raised": why}
    ops = [e.op for e in trace.events()[before:] if e.is_comm]
    if not isinstance(got, (list, tuple)) or len(got) != len(SHAPES):
        return {"raised": ("returned", f"{type(got).__name__} of length "
                           f"{len(got) if hasattr(got, '__len__') else '?'}, not one tensor "
                           f"per matrix ({len(SHAPES)})")}
    cands = _candidates(rank, owners)
    errors = {key: [((g.detach() - c).abs().max().item()
                     if torch.is_tensor(g) and g.shape == c.shape else float("inf"))
                    for g, c in zip(got, cands[key], strict=True)] for key in cands}
    return {"errors": errors, "ops": ops, "calls": calls,
            "flops": sum(ns_flops(*shape) for shape in calls if len(shape) == 2)}


def _in_rank(fns):
    mesh = Mesh(dp=DP)
    out = {"a": [], "rank": mesh.dp.rank}
    for costs, ranks in COSTS:
        got, why = call_kept(fns.lpt_owners, list(costs), ranks)
        if why:
            out["a"] = {"raised": why}
            break
        out["a"].append(list(got) if isinstance(got, (list, tuple)) else got)
    reference = lpt_owners([ns_flops(r, c) for r, c in SHAPES], DP)
    out["b"] = _run_update(fns, mesh, reference)
    out["b"]["owners"] = reference
    mine = out["a"][0] if isinstance(out["a"], list) else None
    valid = (isinstance(mine, list) and len(mine) == len(SHAPES)
             and all(isinstance(o, int) and 0 <= o < DP for o in mine))
    out["c"] = _run_update(fns, mesh, mine) if valid else {"raised": (
        "blank", "lpt_owners gave no map of the 4 ranks")}
    out["c"]["owners"] = mine
    return out
