"""Checks for ex12: ZB-H1's order for stage r, written through the custom-schedule API.

The learner's ``zb_h1_order(p, r, m)`` is called in this process for every stage r of
p = 2, 3, 4 stages and m = p, 2p, 2p+1 microbatches (and the real runs' (p, m), and
m = 2 < p = 4, a warm-up cut short). Graded by properties, not by equality with
`minitp.pipeline.schedules.zb_h1`, so any order with ZB-H1's bound and bubble passes:

* on paper, the dependencies: every F, B, W of every microbatch exactly once per
  stage, each B after its F and each W after its B, the stage's last B or W the last
  microbatch's (what `run_schedule` needs), and the pipeline runs to its end: the
  grader plays the orders out together, and a deadlock is named as the two stages
  that wait for each other, never a hang;
* the activation bound: at most p microbatches in flight on every stage (forwarded, W
  not yet run; `simulate(...)["peak"]`), 1F1B's peak on its first stage;
* the bubble: with the paper's unit costs F = B = W = 1 (`simulate(..., costs=...)`),
  every rank idles exactly p − 1 ticks, (p−1)(F+B−W), for m ≥ p (no order does better:
  the last stage's first forward waits p − 1 forwards);
* exactness: `train_step(schedule=<the order>)` on 4 real ranks, Mesh(pp=4) and
  Mesh(pp=2, dp=2), float64, two AdamW steps: the losses and every parameter equal one
  device's to 1e-10;
* the order is the learner's: no call to `zb_h1` (watched by its code object, whatever
  name it is called by). Calling `one_f_one_b` is allowed.

A failed bound or bubble is matched against the usual mistakes, read off the order's
shape: all W at the end; W not delayed (each W right after its B); a warm-up of other
than p − r − 1 forwards; W delayed by more or less than r.

Its parts: ex12_paper.py (the checks on paper and their diagnoses), ex12_ranks.py (the
run on real ranks); this module calls the learner's function and runs them.
"""

from __future__ import annotations

import torch

from ...pipeline import on_paper, schedules
from ...runtime.errors import LaunchError
from ...runtime.launch import launch
from .base import Check, crashed, failure_check, no_shortcut, not_written
from .ex12_paper import (
    BOUND_ASK,
    BOUND_FIX,
    BUBBLE_ASK,
    BUBBLE_CASES,
    BUBBLE_FIX,
    CASES,
    NAMES,
    UNIT_COSTS,
    _bound,
    _bubble,
    _deadlock,
    _dependencies,
)
from .ex12_ranks import CFG, MESHES, ROWS, STEPS, TOLERANCE, _in_rank, _label
from .watch import CallWatch

__all__ = ["BOUND_ASK", "BOUND_FIX", "BUBBLE_ASK", "BUBBLE_CASES", "BUBBLE_FIX", "CASES",
           "NAMES", "TOLERANCE", "UNIT_COSTS", "_deadlock", "run"]

TIMEOUT = 60.0
STEP_CHECK = True  # the real ranks (the tests of the diagnoses leave them out)
HINT = ("which units of 1F1B's order must stay where they are, which can move, and where "
        "does stage r sit idle?")


def run(module) -> list[Check]:
    fn = module.zb_h1_order
    orders = {}
    with CallWatch({schedules.zb_h1: "minitp.pipeline.schedules.zb_h1"}) as watch:
        for p, m in CASES:
            for r in range(p):
                try:
                    orders[p, m, r] = _units(fn(p, r, m))
                except NotImplementedError as exc:
                    return not_written(NAMES, "zb_h1_order", str(exc).strip("'\"") or HINT)
                except Exception as exc:  # noqa: BLE001 - the learner's bug, politely
                    return crashed(NAMES, f"zb_h1_order({p}, {r}, {m})", exc,
                                   "return a list of (kind, 0, microbatch) tuples, kind "
                                   '"F", "B" or "W"')
    shortcut = no_shortcut(NAMES[4], watch.calls, "write the order yourself: that is the "
                           "exercise (one_f_one_b is allowed)")
    valid = _dependencies(orders)
    if not valid.passed:
        why = "not checked: the order is not a pipeline order yet (see above)"
        return [valid] + [Check(name, False, why) for name in NAMES[1:4]] + [shortcut]
    played = {(p, m): on_paper.simulate(_fixed(orders, p, m), p, m, costs=UNIT_COSTS)
              for p, m in CASES}
    return [valid, _bound(orders, played), _bubble(orders, played), _real(fn), shortcut]


def _units(order) -> list[tuple]:
    """The order as a list of (kind, chunk, microbatch); a malformed unit raises."""
    if not isinstance(order, list | tuple):
        raise TypeError(f"returned {type(order).__name__}, not a list of units")
    units = list(order)
    for unit in units:
        if not (isinstance(unit, tuple | list) and len(unit) == 3
                and unit[0] in ("F", "B", "W") and unit[1] == 0 and isinstance(unit[2], int)):
            raise ValueError(f"{unit!r} is no unit: write (kind, 0, microbatch), kind "
                             '"F", "B" or "W"')
    return [tuple(unit) for unit in units]


def _fixed(orders, p, m):
    return lambda p_, r, m_, v=1: orders[p, m, r]


def _real(fn) -> Check:
    if not STEP_CHECK:
        return Check(NAMES[3], False, "not run")
    g = torch.Generator().manual_seed(3)
    rows = max(ROWS * m * sizes.get("dp", 1) for sizes, m in MESHES)
    batches = [tuple(torch.randint(0, CFG["vocab_size"], (rows, CFG["seq_len"]), generator=g)
                     for _ in range(2)) for _ in range(STEPS)]
    try:
        found = launch(_in_rank, 4, fn, batches, timeout=TIMEOUT)
    except LaunchError as error:
        return failure_check(NAMES[3], error, "zb_h1_order")
    for sizes, m in MESHES:
        mesh = _label(sizes)
        for rank, per_mesh in enumerate(found):
            error, what = per_mesh[mesh]
            if error > TOLERANCE:
                return Check(NAMES[3], False, f"{mesh}, m={m}, rank {rank}: {what} differs "
                             f"from one device's by {error:.3g}", rank=rank, max_error=error,
                             hint="every F, B and W of every microbatch once")
    worst = max(e for per_mesh in found for e, _ in per_mesh.values())
    return Check(NAMES[3], True, f"losses and parameters: largest error {worst:.1e}",
                 max_error=worst)
