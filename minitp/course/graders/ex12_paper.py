"""ex12 on paper: the learner's orders played out together (`on_paper.simulate`) — the
dependencies (a deadlock named as the two stages that wait for each other), the
activation bound and the bubble, each failure matched against the usual mistakes."""

from __future__ import annotations

from .base import Check
from .ex12_ranks import MESHES

UNIT_COSTS = dict(F=1, B=1, W=1)
BUBBLE_CASES = [(p, m) for p in (2, 3, 4) for m in (p, 2 * p, 2 * p + 1)]
CASES = BUBBLE_CASES + [(4, 2)] + [(s["pp"], m) for s, m in MESHES if s["pp"] != m]
NAMES = ["on paper: every F, B and W once, in dependency order, and the pipeline runs to "
         "its end",
         "on paper: at most p microbatches in flight on every stage",
         "on paper: with F = B = W = 1 tick, every rank idles p − 1 ticks",
         "real ranks: pp=4 and pp=2 × dp=2 train exactly as one device (float64)",
         "your own order: no call to minitp.pipeline.schedules.zb_h1"]

# After a named mistake the hint may say the fix; otherwise it asks.
BOUND_FIX = ("a microbatch counts from its F until its W: after stage r's first r B's, "
             "follow each B with the oldest W owed")
BOUND_ASK = ("a microbatch counts from its F until its W: how many does stage r hold at "
             "1F1B's peak, and so how many W's may it owe at once?")
BUBBLE_FIX = ("1F1B's order with stage r's W's delayed by r microbatches: the W's owed at "
              "the end fill the drain, where stage r would wait for the B's coming back")
BUBBLE_ASK = ("where does this rank sit idle, and which of its W's could run there without "
              "breaking the bound?")


def _dependencies(orders) -> Check:
    for p, m in CASES:
        for r in range(p):
            wrong = _stage_wrong(orders[p, m, r], m)
            if wrong:
                detail, hint = wrong
                return Check(NAMES[0], False, f"p={p}, m={m}, stage {r}: {detail}", rank=r,
                             hint=hint)
        stuck = _deadlock([orders[p, m, r] for r in range(p)], p)
        if stuck:
            detail, rank = stuck
            return Check(NAMES[0], False, f"p={p}, m={m}: {detail}", rank=rank,
                         hint="before each B, a stage must have sent every forward the next "
                              "stage runs before its own B of that microbatch: 1F1B's "
                              "warm-up gives stage r p − r − 1 forwards, one more than "
                              "stage r + 1")
    return Check(NAMES[0], True, f"{len(CASES)} pipelines (p = 2, 3, 4; m = 2 … 2p+1)")


def _stage_wrong(order, m):
    """(detail, hint) for the first thing in one stage's order the executor refuses."""
    seen = set()
    for kind, _, i in order:
        if not 0 <= i < m:
            return f"{kind}{i}: microbatch {i} is not one of 0 … {m - 1}", "microbatches 0 … m−1"
        if (kind, i) in seen:
            return f"{kind}{i} runs twice", "each unit once"
        if kind == "B" and ("F", i) not in seen:
            return f"B{i} comes before F{i}", "a backward needs its forward"
        if kind == "W" and ("B", i) not in seen:
            return (f"W{i} comes before B{i}: a weight pass needs the gradient its B "
                    "computed", "append each W after its own B")
        seen.add((kind, i))
    for kind in "FBW":
        missing = [i for i in range(m) if (kind, i) not in seen]
        if missing:
            return (f"{', '.join(f'{kind}{i}' for i in missing)} missing",
                    "every microbatch's F, B and W, once each")
    last = [i for kind, _, i in order if kind != "F"][-1]
    if last != m - 1:
        return (f"the last B or W is microbatch {last}'s, not {m - 1}'s (the data-parallel "
                "gradient sync starts with the last microbatch's)",
                "run the W's owed at the end oldest first")
    return None


def _deadlock(orders, p):
    """Play the orders out together, in dependencies only: None if every stage finishes,
    else (what the two stages that wait for each other wait for, the first's rank)."""
    done, pos = set(), [0] * p
    while True:
        progressed = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, _, i = orders[r][pos[r]]
                if not all(d in done for d in _needs(kind, r, i, p)):
                    break
                done.add((kind, r, i))
                pos[r] += 1
                progressed = True
        if all(pos[r] == len(orders[r]) for r in range(p)):
            return None
        if not progressed:
            break
    # Every stuck stage waits for a neighbour: stage r at a B for r+1's B, stage r+1 at an
    # F for r's F (each is complete, so what is waited for is in a stuck order): a pair.
    stuck = [orders[r][pos[r]] if pos[r] < len(orders[r]) else ("", 0, 0) for r in range(p)]
    for r in range(p - 1):
        (k0, _, i), (k1, _, j) = stuck[r], stuck[r + 1]
        if k0 == "B" and k1 == "F":
            return (f"deadlock: stage {r} waits at B{i} for microbatch {i}'s gradient from "
                    f"stage {r + 1}; stage {r + 1} waits at F{j} for microbatch {j}'s "
                    f"activation, which stage {r} sends only after B{i}: stage {r}'s B{i} "
                    f"comes before the next stage's B{i} can arrive"), r
    return "deadlock", None  # unreachable for complete orders


def _needs(kind, r, i, p):
    if kind == "F":
        return [("F", r - 1, i)] if r > 0 else []
    if kind == "B":
        return [("F", r, i)] + ([("B", r + 1, i)] if r < p - 1 else [])
    return [("B", r, i)]


# --------------------------------------------------------------------------- bound, bubble
def _shape(order, p, r, m) -> dict:
    """What the usual mistakes change, read off one stage's order."""
    kinds = [kind for kind, _, _ in order]
    first_b, last_b, first_w = kinds.index("B"), len(kinds) - 1 - kinds[::-1].index("B"), \
        kinds.index("W")
    return {"ahead": kinds[:first_b].count("F"), "want_ahead": min(p - r, m),
            "delay": kinds[:first_w].count("B") - 1, "want_delay": min(r, m - 1),
            "at_end": first_w > last_b,
            "right_after": all(order[k - 1] == ("B", 0, i)
                               for k, (kind, _, i) in enumerate(order) if kind == "W")}


def _mistake(orders, p, m, bound: bool):
    """(stage, words) for the first stage whose order has a usual mistake's shape."""
    for r in range(p):
        s = _shape(orders[p, m, r], p, r, m)
        if s["at_end"] and r < m - 1:  # (ZB-H1's own stages r ≥ m − 1 have every W last)
            return r, (f"all W at the end: each microbatch is held from its F until its W, "
                       f"so stage {r} holds all m = {m}" if bound else
                       "all W at the end: they wait behind the last B and cannot fill the "
                       f"gaps while stage {r} waits for the gradients coming back")
        if s["ahead"] != s["want_ahead"]:
            more = ": each extra one is one more microbatch held" if bound else ""
            return r, (f"stage {r} runs {s['ahead']} forwards before its first B, where "
                       f"1F1B runs p − r = {s['want_ahead']} (a warm-up of p − r − 1, then "
                       f"one forward and one backward){more}")
        if r > 0 and s["right_after"] and not bound:
            return r, (f"W not delayed: on stage {r} each W runs right after its B, so the "
                       "B's reach the first stage later and no W is left for the drain")
        if s["delay"] != s["want_delay"]:
            return r, (f"stage {r}'s first W comes after {s['delay'] + 1} B's: its W's are "
                       f"delayed by {_microbatches(s['delay'])}, where ZB-H1 delays stage r's "
                       f"by r = {s['want_delay']}")
    return None, ""


def _bound(orders, played) -> Check:
    for p, m in _largest_first(CASES):
        peaks = played[p, m]["peak"]
        worst = max(peaks)
        if worst > p:
            _, words = _mistake(orders, p, m, bound=True)
            why = f": {words}" if words else ""
            return Check(NAMES[1], False, f"p={p}, m={m}: stage {peaks.index(worst)} holds "
                         f"{worst} microbatches at once, more than p = {p}{why}",
                         rank=peaks.index(worst), hint=BOUND_FIX if words else BOUND_ASK)
    return Check(NAMES[1], True, f"{len(CASES)} pipelines; at p=4, m=8 the stages' peaks are "
                 f"{played[4, 8]['peak']}")


def _bubble(orders, played) -> Check:
    for p, m in _largest_first(BUBBLE_CASES):
        idle = played[p, m]["idle"]
        if max(idle) != p - 1:
            r, words = _mistake(orders, p, m, bound=False)
            why = f": {words}" if words else ""
            return Check(NAMES[2], False, f"p={p}, m={m}: every rank idles "
                         f"{_ticks(max(idle), p)}, where ZB-H1 idles p − 1 = {p - 1}{why}",
                         rank=r, hint=BUBBLE_FIX if words else BUBBLE_ASK)
    return Check(NAMES[2], True, f"p − 1 on every rank, m = p, 2p, 2p+1 ({len(BUBBLE_CASES)} "
                 "pipelines; 1F1B idles 3(p − 1))")


def _largest_first(cases):
    """p = 4 first: the lesson's pipeline, where a mistake's cost shows most."""
    return sorted(cases, key=lambda case: (-case[0], case[1]))


def _ticks(idle, p) -> str:
    """An idle time, named where it is a known schedule's: 2(p − 1) is (p − 1)(F + B), each
    W on the B's path; 3(p − 1) is 1F1B's (p − 1)(F + B + W)."""
    known = {2 * (p - 1): " = 2(p − 1) = (p − 1)(F + B)",
             3 * (p - 1): " = 3(p − 1), 1F1B's (p − 1)(F + B + W)"}
    return f"{idle} tick{'s' if idle != 1 else ''}{known.get(idle, '')}"


def _microbatches(n) -> str:
    return f"{n} microbatch{'es' if n != 1 else ''}"
