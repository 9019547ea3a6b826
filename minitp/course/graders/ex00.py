"""Checks for ex00: a rank's coordinates and groups in the (dp, pp, tp) mesh.

For several meshes, on real processes (one per rank), every rank asks the
learner's `coordinates` and `group_ranks` about itself, and compares the answers
with the `Mesh` the same run builds (`mesh.dp.rank`, `mesh.pp.ranks`, …): an
independent reference, the groups torch.distributed really created.
"""

from __future__ import annotations

from ...runtime.launch import launch
from ...runtime.mesh import Mesh, world
from .base import Check, run_per_size

MESHES = ((2, 2, 2), (1, 2, 4), (2, 3, 1))  # (dp, pp, tp): each size 1 somewhere, pp = 3 once
AXES = ("dp", "pp", "tp")


def _in_rank(coordinates, group_ranks, sizes):
    """Runs on every rank: the learner's answers beside the mesh's."""
    dp, pp, tp = sizes
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    rank = world().rank
    expected = {"coordinates": (mesh.dp.rank, mesh.pp.rank, mesh.tp.rank),
                **{axis: list(getattr(mesh, axis).ranks) for axis in AXES}}
    got = {}
    try:  # a blank raises on every rank at the same point: say which function it is
        got["coordinates"] = tuple(coordinates(rank, dp, pp, tp))
    except NotImplementedError as exc:
        return {"missing": ("coordinates", str(exc))}
    try:
        got.update({axis: list(group_ranks(rank, axis, dp, pp, tp)) for axis in AXES})
    except NotImplementedError as exc:
        return {"missing": ("group_ranks", str(exc))}
    return {"rank": rank, "expected": expected, "got": got}


def run(module) -> list[Check]:
    def launch_at(sizes):
        dp, pp, tp = sizes
        return launch(_in_rank, dp * pp * tp, module.coordinates, module.group_ranks, sizes,
                      timeout=10.0)

    return run_per_size(MESHES, _names, launch_at, _judge, blank=_blank,
                        what="coordinates", size="(dp, pp, tp)")


def _names(sizes) -> list[str]:
    dp, pp, tp = sizes
    return [f"dp={dp} pp={pp} tp={tp}: every rank's (dp index, stage, tp index)",
            f"dp={dp} pp={pp} tp={tp}: every rank's dp, pp and tp groups"]


def _missing(per_rank):
    return next((r["missing"] for r in per_rank if "missing" in r), None)


def _blank(per_rank, checks) -> str | None:
    missing = _missing(per_rank)
    return f"{missing[0]} is not written yet" if missing else None


def _judge(sizes, names, per_rank) -> list[Check]:
    missing = _missing(per_rank)
    if missing:
        return ([Check(names[0], False, f"{missing[0]} is not written yet", hint=missing[1])]
                + [Check(n, False, f"not checked: {missing[0]} is not written yet")
                   for n in names[1:]])
    return [_coordinates(names[0], per_rank, sizes), _groups(names[1], per_rank)]


def _coordinates(name, per_rank, sizes) -> Check:
    dp, pp, tp = sizes
    for r in per_rank:
        if r["got"]["coordinates"] != r["expected"]["coordinates"]:
            return Check(name, False, f"rank {r['rank']}: you said (dp, stage, tp) = "
                         f"{r['got']['coordinates']}, the mesh says {r['expected']['coordinates']}",
                         rank=r["rank"], tensor="coordinates",
                         hint=f"list ranks 0..{dp * pp * tp - 1} with the tp index changing "
                              "fastest and read off which index changes next")
    return Check(name, True, f"all {dp * pp * tp} ranks")


def _groups(name, per_rank) -> Check:
    for r in per_rank:
        for axis in AXES:
            if r["got"][axis] != r["expected"][axis]:
                return Check(name, False, f"rank {r['rank']}, {axis} group: you said "
                             f"{r['got'][axis]}, the mesh says {r['expected'][axis]}",
                             rank=r["rank"], tensor=f"{axis} group",
                             hint=f"the {axis} group keeps every coordinate but the {axis} one; "
                                  "how far apart are two ranks that differ by 1 in it?")
    return Check(name, True, "dp, pp and tp groups of every rank")
