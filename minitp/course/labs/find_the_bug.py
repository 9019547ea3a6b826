"""Lab: find the bug (lesson 28). One bug walked through with the tools, then a broken run
drawn from the museum (`minitp.debug.museum`) by the learner's name, its bug not named.

    spoiled, fixed = walkthrough()   # one launch of 4 ranks: the walked bug, then its fix
    sp_sum_bytes(spoiled)            # the bytes the SP partial-sum all-reduce carried
    run = broken_run("your name")    # a `Visit` whose key is hidden
    print(describe(run))             # loss, first divergence (or hang), the trace's collectives

The walked bug (Megatron-LM issue #1446: the norms' gradients under sequence parallelism
left as each rank's part) is left out of the draw, so a learner's run is never the one the
lesson solved. Exercise 28 grades the same draw (`yours`).
"""

from __future__ import annotations

import json
from dataclasses import replace

from ...debug import museum
from ...debug.museum import describe  # noqa: F401  (the lesson's one import for it)

WALKTHROUGH = "sp_norm_grads_not_summed"
AMONG = tuple(k for k in museum.MUSEUM if k != WALKTHROUGH)
HIDDEN = "(not named: that is your question)"


def yours(name: str) -> str:
    """The museum key `name` draws (the walked bug left out)."""
    return museum.draw(name, among=AMONG)


def walkthrough():
    """(the walked bug's `Visit`, its fix's), from one launch of 4 ranks."""
    return museum.before_and_after(WALKTHROUGH)[WALKTHROUGH]


def sp_sum_bytes(visit) -> int:
    """Bytes of the all-reduces that sum sequence parallelism's partial gradients."""
    return sum(e.nbytes for e in visit.trace if e.label == "sequence-parallel grads")


def broken_run(name: str):
    """The learner's broken run: its `Visit`, the key hidden."""
    key = yours(name)
    return replace(museum.reproduce(key)[key], key=HIDDEN)


def chrome_events(visit, path) -> dict:
    """Write `visit`'s trace for Perfetto and read it back: how many events of each kind
    (name) the file holds, the collectives' among them."""
    visit.trace.to_chrome(path)
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    counts = {}
    for e in events:
        if e.get("ph") == "X":
            counts[e["name"]] = counts.get(e["name"], 0) + 1
    return counts
