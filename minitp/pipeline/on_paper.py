"""Schedules played out on paper: each unit takes a set cost in ticks and starts when
its rank is free and its inputs have arrived — the bubble, the idle and the peak a
schedule's order implies, with no process started (`minitp.pipeline.schedules` holds
the orders). A MODEL: the costs are set, nothing is measured.
"""

from __future__ import annotations

from ..rules.schedules import placement_of, stage_of
from .schedules import SCHEDULES


def simulate(schedule, p: int, m: int, v: int = 1, costs=None, placement=None) -> dict:
    """Run the schedule on paper: each unit takes its cost in ticks, a unit starts when
    its rank is free and its inputs have arrived (a B needs the next stage's B, not its
    W); a "B" with no "W" of its own is the whole backward and costs B + W. Default costs:
    one tick per forward and per whole backward (W costs 0); the zero-bubble paper's unit
    costs are ``costs=dict(F=1, B=1, W=1)``. A cost for "F&B" runs each of DualPipe's
    pairs (`overlapped_pairs`) as one unit of that cost whose two results leave when it
    ends, as DualPipe's overlapping runtime runs them; without it the two halves run one
    after the other, as minitp runs them. `schedule`: a name or a schedule function.
    Returns {"ticks", "busy", "bubble", "idle", "inner_idle", "peak"}: per rank, idle =
    ticks − its busy time, inner_idle the idle between its first and last unit, peak the
    most microbatches it holds at once (forwarded, weight gradients not yet done); busy =
    the busiest rank's time; bubble = the largest idle / busy. placement: where the
    chunks sit (default: the one a named schedule runs on, "loop" for a function)."""
    costs = {"F": 1, "B": 1, "W": 0, **(costs or {})}
    placement = placement or placement_of(schedule)
    make = SCHEDULES[schedule] if isinstance(schedule, str) else schedule
    orders = [make(p, r, m, v) for r in range(p)]
    split = [{(k, i) for kind, k, i in order if kind == "W"} for order in orders]

    def cost(r, kind, k, i):
        return costs[kind] + (costs["W"] if kind == "B" and (k, i) not in split[r] else 0)

    steps = [overlapped_pairs(order) if "F&B" in costs else [[u] for u in order]
             for order in orders]
    work = [sum(costs["F&B"] if len(step) == 2 else cost(r, *step[0]) for step in steps[r])
            for r in range(p)]
    done, clock, pos, first = {}, [0] * p, [0] * p, [None] * p
    n = p * v
    while any(pos[r] < len(steps[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            if pos[r] == len(steps[r]):
                continue
            step, need = steps[r][pos[r]], []
            for kind, k, i in step:
                g = stage_of(p, r, k, placement)
                if kind == "F" and g > 0:
                    need.append(("F", g - 1, i))
                if kind == "B":
                    need += [("F", g, i)] + ([("B", g + 1, i)] if g < n - 1 else [])
                if kind == "W":
                    need.append(("B", g, i))
            if all(d in done for d in need):  # (a pair's halves: other chunks, microbatches)
                start = max([clock[r]] + [done[d] for d in need])
                first[r] = start if first[r] is None else first[r]
                clock[r] = start + (costs["F&B"] if len(step) == 2 else cost(r, *step[0]))
                for kind, k, i in step:  # a pair's results leave together, when it ends
                    done[(kind, stage_of(p, r, k, placement), i)] = clock[r]
                pos[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule} deadlocks for p={p}, m={m}, v={v}")
    ticks = max(clock)
    idle = [ticks - work[r] for r in range(p)]
    return {"ticks": ticks, "busy": max(work), "bubble": max(idle) / max(work), "idle": idle,
            "inner_idle": [clock[r] - first[r] - work[r] for r in range(p)],
            "peak": [_peak(order) for order in orders]}


def overlapped_pairs(order) -> list[list[tuple[str, int, int]]]:
    """The rank's units in order, DualPipe's "F&B" pairs together: a forward followed at
    once by the other chunk's whole backward (a B with no W of its own) — in
    `dualpipev`'s order exactly the pairs of its phases 4 and 5."""
    whole = {(k, i) for kind, k, i in order if kind == "B"} - {
        (k, i) for kind, k, i in order if kind == "W"}
    steps, j = [], 0
    while j < len(order):
        unit, following = order[j], order[j + 1] if j + 1 < len(order) else None
        if (unit[0] == "F" and following and following[0] == "B" and following[1] != unit[1]
                and following[1:] in whole):
            steps.append([unit, following])
            j += 2
        else:
            steps.append([unit])
            j += 1
    return steps


def _peak(order) -> int:
    """The most microbatches a rank holds at once: forwarded, weight gradients not done
    (a "B" without its own "W" finishes them)."""
    split = {(k, i) for kind, k, i in order if kind == "W"}
    live = best = 0
    for kind, k, i in order:
        done = kind == "W" or (kind == "B" and (k, i) not in split)
        live += 1 if kind == "F" else -1 if done else 0
        best = max(best, live)
    return best
