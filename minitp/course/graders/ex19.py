"""Checks for ex19: the refit plan of one weight, from training at (pp 2, tp 2) to serving at
tp 4 on the same four ranks.

The learner's `refit_plan(layer, n_layer, shape, split_dim)` for four weights of a
4-layer GPT: the MLP's first matrix (column-parallel, split on dim 0) of layers 0 and 3,
its second (row-parallel, split on dim 1) of layers 1 and 2 — a layer on each pipeline
stage for each kind. The plan is run: a dense float64 weight of distinct numbers is cut
into the four training shards (ranks 0, 1 hold stage 0's layers, ranks 2, 3 stage 1's; a
stage's two ranks the two tp-2 slices), every piece is copied from its source's shard
into its target's serving slice, and each serving slice must equal the dense weight's
tp-4 slice. Where it does not, the first of the usual mistakes found is named:

* a pipeline stage forgotten: a piece taken from a rank of the other stage, which holds
  none of this layer;
* a weight split on the wrong dimension (a row-parallel weight cut by rows, or a
  column-parallel one by columns);
* a shard sent twice: an element a serving rank receives more than once;
* a piece never sent, sent outside the target's slice, or taken from the stage's other
  rank, which holds the other half.

Then the plan is set beside the library's (`minitp.serving.refit.plan_sources` on the two
layouts' masks: each element from the rank itself when it holds it, else from the first
holder after it in rank order), element by element, and each (source, target) pair must be
one piece: one message, as `refit` posts. No process is launched.
"""

from __future__ import annotations

import torch

from ...serving.refit import plan_sources
from .base import Check, Stopped, attempt

PP, TP, SERVE_TP, WORLD, N_LAYER = 2, 2, 4, 4, 4
KINDS = {0: "column-parallel (split on dim 0, its output features)",
         1: "row-parallel (split on dim 1, its input features)"}
CASES = {0: [("layer 0's MLP first matrix", 0, (32, 8)),
             ("layer 3's MLP first matrix", 3, (32, 8))],
         1: [("layer 1's MLP second matrix", 1, (8, 32)),
             ("layer 2's MLP second matrix", 2, (8, 32))]}
NAMES = ["column-parallel weights (layers 0, 3), run: each serving rank its tp-4 slice, "
         "each element once, from a rank that holds it",
         "row-parallel weights (layers 1, 2), run: each serving rank its tp-4 slice, each "
         "element once, from a rank that holds it",
         "the library's plan (minitp.serving.refit.plan_sources): the same source for every "
         "element, one piece per (source, target) pair"]
FORM = ("return a list of (source, target, (row_start, row_stop), (col_start, col_stop)): "
        "ranks 0-3, half-open ranges inside the dense weight")
HINT = ("work out on paper: which stage holds the layer (n_layer // 2 layers a stage), its "
        "two ranks' tp-2 slices along split_dim, and where each tp-4 slice lies inside them")


def stage_of(layer: int, n_layer: int = N_LAYER) -> int:
    return layer // (n_layer // PP)


def span(rank_in_group: int, ways: int, size: int) -> tuple[int, int]:
    return rank_in_group * size // ways, (rank_in_group + 1) * size // ways


def masks(layer: int, shape, split_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(have, need): (4, rows, cols) bool, what each rank holds of the weight in training
    and must hold in serving."""
    have = torch.zeros(WORLD, *shape, dtype=torch.bool)
    need = torch.zeros(WORLD, *shape, dtype=torch.bool)
    for r in range(WORLD):
        if r // TP == stage_of(layer):
            have[r].narrow(split_dim, *_start_len(span(r % TP, TP, shape[split_dim]))).fill_(True)
        need[r].narrow(split_dim, *_start_len(span(r, SERVE_TP, shape[split_dim]))).fill_(True)
    return have, need


def library_sources(layer: int, shape, split_dim: int) -> torch.Tensor:
    """(4, rows, cols): the rank the library's plan takes each element of each serving
    rank's slice from (-1: not needed)."""
    have, need = masks(layer, shape, split_dim)
    flat = plan_sources(have.reshape(WORLD, -1).to(torch.uint8),
                        need.reshape(WORLD, -1).to(torch.uint8))
    return flat.view(WORLD, *shape)


def _start_len(bounds):
    return bounds[0], bounds[1] - bounds[0]


def _block(rows, cols) -> str:
    return f"rows {rows[0]}:{rows[1]}, cols {cols[0]}:{cols[1]}"


def _valid(plan, shape) -> str | None:
    if not isinstance(plan, list | tuple):
        return f"returned {type(plan).__name__}"
    for piece in plan:
        try:
            s, t, (r0, r1), (c0, c1) = piece
            ok = all(isinstance(v, int) for v in (s, t, r0, r1, c0, c1))
        except (TypeError, ValueError):
            ok = False
        if not ok or not (0 <= s < WORLD and 0 <= t < WORLD and 0 <= r0 < r1 <= shape[0]
                          and 0 <= c0 < c1 <= shape[1]):
            return f"returned the piece {piece!r}"
    return None


def diagnose(label: str, layer: int, shape, split_dim: int, plan) -> str | None:
    """Why running `plan` does not give every serving rank its slice (None: it does)."""
    stage, other = stage_of(layer), 1 - split_dim
    have, need = masks(layer, shape, split_dim)
    for s, t, rows, cols in plan:
        if s // TP != stage:
            return (f"{label}: rank {s} sends rank {t} {_block(rows, cols)}, but layer {layer} "
                    f"lives on stage {stage} (ranks {stage * TP}, {stage * TP + 1}): a pipeline "
                    f"stage forgotten, rank {s} holds none of it")
    count = torch.zeros(WORLD, *shape, dtype=torch.int64)
    for _, t, rows, cols in plan:
        count[t, rows[0]:rows[1], cols[0]:cols[1]] += 1
    for t in range(WORLD):
        crossed = torch.zeros(shape, dtype=torch.bool)
        crossed.narrow(other, *_start_len(span(t, SERVE_TP, shape[other]))).fill_(True)
        if bool((count[t] > 0).eq(crossed).all()) and not bool(need[t].eq(crossed).all()):
            return (f"{label}, {KINDS[split_dim]}: rank {t} gets slice {t} of dim {other}, "
                    f"where serving splits dim {split_dim}: the weight split on the wrong "
                    "dimension")
    for t in range(WORLD):
        if bool((count[t] > 1).any()):
            twice = [(s, r) for s, tt, r, c in plan if tt == t]
            return (f"{label}: rank {t} receives some elements {int(count[t].max())} times "
                    f"(pieces from ranks {sorted({s for s, _ in twice})}): a shard sent twice")
        if bool((need[t] & (count[t] == 0)).any()):
            return (f"{label}: rank {t} never gets part of its slice (what it already holds "
                    "counts only when listed, with source == target)")
        if bool((~need[t] & (count[t] > 0)).any()):
            return f"{label}: rank {t} receives elements outside its tp-4 slice"
    for s, t, rows, cols in plan:
        if not bool(have[s, rows[0]:rows[1], cols[0]:cols[1]].all()):
            return (f"{label}: rank {s} sends rank {t} {_block(rows, cols)}, which it does not "
                    f"hold: it holds the tp-2 slice {s % TP} of stage {stage}")
    return None


def run_plan(layer: int, shape, split_dim: int, plan) -> list[torch.Tensor]:
    """Each serving rank's slice after `plan` is run on a dense weight of distinct numbers
    (NaN where nothing arrived)."""
    dense = torch.arange(shape[0] * shape[1], dtype=torch.float64).view(shape)
    have, need = masks(layer, shape, split_dim)
    shards = [torch.where(have[r], dense, torch.nan) for r in range(WORLD)]  # in place
    served = [torch.full(shape, torch.nan, dtype=torch.float64) for _ in range(WORLD)]
    for s, t, (r0, r1), (c0, c1) in plan:
        served[t][r0:r1, c0:c1] = shards[s][r0:r1, c0:c1]
    return [torch.where(need[r], served[r], 0.0) for r in range(WORLD)]


def _judge_kind(split_dim: int, plans: dict) -> Check:
    name = NAMES[split_dim]
    for label, layer, shape in CASES[split_dim]:
        plan = plans[label]
        wrong = _valid(plan, shape)
        if wrong:
            return Check(name, False, f"{label}: {wrong}", hint=FORM)
        why = diagnose(label, layer, shape, split_dim, plan)
        if why:
            return Check(name, False, why, hint=HINT)
        dense = torch.arange(shape[0] * shape[1], dtype=torch.float64).view(shape)
        need = masks(layer, shape, split_dim)[1]
        got = run_plan(layer, shape, split_dim, plan)
        if not all(torch.equal(got[r], torch.where(need[r], dense, 0.0)) for r in range(WORLD)):
            return Check(name, False, f"{label}: a serving slice differs after the run",
                         hint=HINT)
    return Check(name, True, "every serving slice equals the dense weight's, after the run")


def _judge_library(plans: dict) -> Check:
    name = NAMES[2]
    for split_dim, cases in CASES.items():
        for label, layer, shape in cases:
            plan = plans[label]
            if _valid(plan, shape):
                return Check(name, False, "not checked: the plan above is not well formed")
            theirs = library_sources(layer, shape, split_dim)
            mine = torch.full((WORLD, *shape), -1, dtype=torch.int64)
            for s, t, (r0, r1), (c0, c1) in plan:
                mine[t, r0:r1, c0:c1] = s
            if not torch.equal(mine, theirs):
                t = int(torch.nonzero((mine != theirs).flatten(1).any(1))[0])
                return Check(name, False, f"{label}: rank {t}'s slice comes from other ranks "
                             "than the library's plan says", hint="each element from the rank "
                             "itself when it holds it (no message), else from the rank that does")
            pairs = [(s, t) for s, t, _, _ in plan]
            repeated = sorted({p for p in pairs if pairs.count(p) > 1})
            if repeated:
                s, t = repeated[0]
                return Check(name, False, f"{label}: rank {s} gives rank {t} "
                             f"{pairs.count((s, t))} pieces", hint="one message per (source, "
                             "target) pair: merge the pieces, as refit posts one")
    return Check(name, True, "the same sources, one piece per pair")


def run(module) -> list[Check]:
    plans = {}
    try:
        for split_dim, cases in CASES.items():
            for label, layer, shape in cases:
                plans[label] = attempt(module.refit_plan, layer, N_LAYER, shape, split_dim,
                                       names=NAMES, blank="refit_plan", label=label, hint=FORM)
    except Stopped as stop:
        return stop.checks
    return [_judge_kind(0, plans), _judge_kind(1, plans), _judge_library(plans)]
