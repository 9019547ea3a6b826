"""ex17's six checks, from the calculator's verdict on each plan (ex17_reference.py) and
the calls the learner's code made."""

from __future__ import annotations

from collections import Counter

from ...calc.network.cluster import GiB
from .base import Check
from .ex17_cases import (
    BUBBLE_TOLERANCE,
    CALLS_PER_RUN,
    CASES,
    MEMORY_TOLERANCE,
    NAMES,
    PART_HINTS,
    SEARCH,
    SHORTCUT,
    STOPS,
    TOLERANCE,
    WHY,
)


def _close(value, target, tolerance) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value - target) <= tolerance * max(abs(target), 1e-12)


def _slip(value, slips: dict, tolerance) -> str:
    """The name of the usual mistake that ``value`` matches, or ''."""
    return next((name for name, number in slips.items() if _close(value, number, tolerance)),
                "")


def _valid(judged) -> Check:
    for r in judged:
        if "invalid" in r:
            return Check(NAMES[0], False, r["invalid"], tensor="plan",
                         hint="dp · pp · tp must be the GPU count, tp must divide the heads "
                              "(and the hidden size and sequence), pp the layers, dp the "
                              "global batch")
    return Check(NAMES[0], True, f"{len(judged)} runs")


def _fitting(r) -> bool:
    return "memory" in r and r["memory"]["total"] <= r["cap"] * GiB


def _not_checked(name, judged, checked) -> Check | None:
    skipped = [r["label"] for r in judged if r not in checked]
    if skipped:
        return Check(name, False, f"not checked for {'; '.join(skipped)}: see above")
    return None


def _fits(judged) -> Check:
    valid = [r for r in judged if "memory" in r]
    for r in valid:
        if _fitting(r):
            continue
        memory = r["memory"]
        states = memory["total"] - memory["activations"]
        hint = ("model states shrink with pp and tp (and with ZeRO, over dp); activations "
                "with tp (sequence parallel) and recomputation")
        if r.get("with zero 1", float("inf")) <= r["cap"] * GiB:
            hint = (f"with ZeRO-1 (the distributed optimizer: 6 + 12/dp bytes per parameter) "
                    f"the same plan needs {r['with zero 1'] / GiB:.1f} GiB, and costs the "
                    "same time in this model")
        return Check(NAMES[1], False, f"{r['label']}: {r['plan']} needs "
                     f"{memory['total'] / GiB:.1f} GiB on its busiest GPU (model states "
                     f"{states / GiB:.1f}, activations {memory['activations'] / GiB:.1f}), over "
                     f"the {r['cap']} GiB cap", tensor="memory",
                     max_error=memory["total"] / (r["cap"] * GiB) - 1, hint=hint)
    return (_not_checked(NAMES[1], judged, valid)
            or Check(NAMES[1], True, f"{len(judged)} runs"))


def _fast(judged) -> Check:
    fitting = [r for r in judged if _fitting(r)]
    for r in fitting:
        mine, best = r["time"], r["best"].time
        slower = mine.total / best.total - 1
        if slower <= TOLERANCE:
            continue
        excess = {part: getattr(mine, part) - getattr(best, part) for part in PART_HINTS}
        part = max(excess, key=excess.get)
        hint = PART_HINTS[part]
        if r["zero"] == 0 and r["needs zero"]:
            hint += (" Here no plan without ZeRO comes within "
                     f"{TOLERANCE:.0%} of the best: what does sharding over dp free?")
        return Check(NAMES[2], False, f"{r['label']}: {r['plan']} takes {mine.total:.3g} s per "
                     f"step, {slower:.0%} slower than the best plan that fits "
                     f"({best.total:.3g} s); the most of it is {part}: "
                     f"{getattr(mine, part):.3g} s against {getattr(best, part):.3g} s",
                     tensor=part, max_error=slower, hint=hint)
    worst = max(r["time"].total / r["best"].time.total - 1 for r in fitting) if fitting else 0
    return (_not_checked(NAMES[2], judged, fitting)
            or Check(NAMES[2], True, f"{len(judged)} runs, the slowest {worst:+.1%} "
                     "against the best"))


def _why_of(r) -> tuple[dict | None, str]:
    """The learner's justification of a valid plan, or why there is none to check."""
    why = r["why"]
    if not isinstance(why, dict):
        return None, f"{r['label']}: the plan has no \"why\" (got {why!r})"
    missing = [k for k in WHY if k not in why]
    if missing:
        return None, f"{r['label']}: \"why\" lacks {', '.join(missing)}"
    return why, ""


def _memory_why(judged) -> Check:
    valid = [r for r in judged if "memory" in r]
    hint = ("the busiest GPU in GiB (2^30 bytes): calc.memory_per_gpu(...)['total'] / 2**30, "
            "model states and activations together; the shallower plan keeps tp, recompute "
            "and the ZeRO stage and takes the next valid depth below pp")
    for r in valid:
        why, problem = _why_of(r)
        if problem:
            return Check(NAMES[3], False, problem, tensor="why", hint=hint)
        e = r["expected"]
        given = why["memory_gib"]
        if not _close(given, e["memory_gib"], MEMORY_TOLERANCE):
            slip = _slip(given, e["memory slips"], MEMORY_TOLERANCE)
            return Check(NAMES[3], False, f"{r['label']}: memory_gib is {_shown(given)}, but "
                         f"calc.memory_per_gpu gives {r['plan']} {e['memory_gib']:.2f} GiB"
                         + (f": {_shown(given)} is {slip}" if slip else ""), tensor="memory_gib",
                         max_error=_error(given, e["memory_gib"]), hint=hint)
        given, target = why["shallower_gib"], e["shallower_gib"]
        if target is None and given is not None:
            return Check(NAMES[3], False, f"{r['label']}: shallower_gib is {_shown(given)}, but "
                         f"pp={r['pp']} is already the shallowest valid "
                         "depth at this tp: expected None", tensor="shallower_gib", hint=hint)
        if target is not None and not _close(given, target, MEMORY_TOLERANCE):
            slip = _slip(given, e["shallower slips"], MEMORY_TOLERANCE)
            detail = (f"{r['label']}: shallower_gib is {_shown(given)}, but the same plan at "
                      f"pp={e['shallower']}, the next valid depth below, needs "
                      f"{target:.2f} GiB ({'over' if target > r['cap'] else 'under'} the "
                      f"{r['cap']} GiB cap)")
            if slip:
                detail += f": {_shown(given)} is {slip}"
            return Check(NAMES[3], False, detail, tensor="shallower_gib",
                         max_error=_error(given, target), hint=hint)
    return (_not_checked(NAMES[3], judged, valid)
            or Check(NAMES[3], True, f"{len(judged)} runs"))


def _shown(value) -> str:
    """A learner's number as the report shows it: four figures, or as it came."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return repr(value)


def _error(given, target) -> float | None:
    if isinstance(given, bool) or not isinstance(given, int | float):
        return None
    return abs(given / target - 1) if target else None


def _stop_and_bubble(judged) -> Check:
    valid = [r for r in judged if "memory" in r]
    for r in valid:
        why, problem = _why_of(r)
        if problem:
            return Check(NAMES[4], False, problem, tensor="why",
                         hint="return the plan's keys and a \"why\" dict with "
                              + ", ".join(WHY))
        e = r["expected"]
        stop = why["tp_stop"]
        if stop != e["tp_stop"]:
            known = "" if stop in STOPS else f" (one of {', '.join(map(repr, STOPS))})"
            return Check(NAMES[4], False, f"{r['label']}: tp_stop is {stop!r}{known}, but for "
                         f"{r['plan']} it is {e['tp_stop']!r}: {e['stop reason']}",
                         tensor="tp_stop", hint="; ".join(f"{k!r}: {v}"
                                                          for k, v in STOPS.items()))
        given = why["bubble"]
        if not _close(given, e["bubble"], BUBBLE_TOLERANCE) and not (
                e["bubble"] == 0 and given == 0):
            slip = _slip(given, e["bubble slips"], BUBBLE_TOLERANCE)
            return Check(NAMES[4], False, f"{r['label']}: bubble is {_shown(given)}, but (p - 1)/m "
                         f"for {r['plan']} is {e['bubble']:.4f}"
                         + (f": {_shown(given)} is {slip}" if slip else ""), tensor="bubble",
                         max_error=_error(given, e["bubble"]),
                         hint="Narayanan et al. 2021, §2.2: the bubble is (p - 1)/m of the "
                              "ideal time, m = global_batch / dp microbatches per replica")
    return (_not_checked(NAMES[4], judged, valid)
            or Check(NAMES[4], True, f"{len(judged)} runs"))


def _reasoned(runs: list[Counter]) -> Check:
    planner = sorted({name for calls in runs for name in calls
                      if name in ("calc.plan", "calc.planning.search.every_configuration")})
    if planner:
        return Check(NAMES[5], False, f"your code called {', '.join(planner)}", hint=SHORTCUT)
    counted = [sum(calls.values()) for calls in runs]
    worst = max(range(len(runs)), key=counted.__getitem__)
    if counted[worst] > CALLS_PER_RUN:
        calls = runs[worst]
        each = " and ".join(f"{name} {calls[name]} times" for name in
                            ("calc.memory_per_gpu", "calc.step_time") if calls[name])
        return Check(NAMES[5], False, f"{CASES[worst][0]}: your code called {each}, "
                     f"{counted[worst]} in all where {CALLS_PER_RUN} are allowed: that is a "
                     "search", tensor="calls", hint=SEARCH)
    return Check(NAMES[5], True, f"at most {max(counted)} calculator calls in a run")
