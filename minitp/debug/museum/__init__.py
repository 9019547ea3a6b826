"""`mt.debug.museum`: real bugs of parallel training from the anchors' trackers, each one
setting of minitp away (docs/debugging.md, lesson 28).

``MUSEUM``: key -> `Bug` (its citation, symptom, whether it drifts or hangs, the setting
that reproduces it, its fix). `reproduce(keys, fixed=False)` runs them on 4 real ranks:
every drifting bug of `keys` in one launch (each rank runs them one after another), each
hanging one in its own with a short timeout; `draw(name)` picks one by a learner's name;
`before_and_after(keys)` runs drifting bugs spoiled and fixed in one launch;
`describe(visit)` says what a run showed without naming its bug (`minitp.debug.museum.report`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ...runtime import trace
from ...runtime.chrome_trace import Trace
from ...runtime.errors import CollectiveTimeout
from ...runtime.launch import launch
from ..divergence import Divergence, earliest
from .catalog import BUGS, MUSEUM, Bug
from .report import FIXES, describe

WORLD = 4


@dataclass
class Visit:
    """What a bug's run showed: `context` (what its owner knows of the run, the bug not
    said), `departure` (the largest abs difference from one device,
    over the ranks), `divergence` (a step bug's first departing module), `losses` (each
    rank's step loss) beside `reference_loss` (one device's), `hung` and `report` (the
    CollectiveTimeout's text) for a hang, `trace` (the launch's events)."""

    key: str
    context: str = ""
    departure: float | None = None
    divergence: Divergence | None = None
    losses: list = field(default_factory=list)
    reference_loss: float | None = None
    hung: bool = False
    report: str = ""
    trace: list = field(default_factory=list, repr=False)


def on_rank(keys, fixed: bool) -> dict:
    """Every rank: each bug of `keys` run in turn (spoiled, or with its fix), with this
    rank's trace events of that bug alone (``"events"``)."""
    out = {}
    for key in keys:
        trace.clear()
        out[key] = {**MUSEUM[key].run(fixed), "events": trace.events()}
    return out


def _check(keys) -> list[str]:
    keys = list(MUSEUM) if keys is None else [keys] if isinstance(keys, str) else list(keys)
    unknown = [k for k in keys if k not in MUSEUM]
    if unknown:
        raise ValueError(f"{unknown} are not in the museum; its bugs are {', '.join(MUSEUM)}")
    return keys


def visit(key: str, ranks: list) -> Visit:
    """The `Visit` of a run from every rank's `on_rank` result for `key`."""
    first = earliest(ranks) if all("first" in r for r in ranks) else None
    events = sorted((e for r in ranks for e in r["events"]), key=lambda e: e.start)
    return Visit(key, MUSEUM[key].context(), max(r["departure"] for r in ranks), first,
                 [r.get("loss") for r in ranks], ranks[0].get("reference_loss"),
                 trace=Trace(events))


def _both(keys) -> dict:
    return {fixed: on_rank(keys, fixed) for fixed in (False, True)}


def before_and_after(keys, timeout: float = 120.0) -> dict[str, tuple[Visit, Visit]]:
    """key -> (spoiled `Visit`, fixed `Visit`) of drifting bugs, in one launch."""
    keys = _check(keys)
    hangs = [k for k in keys if MUSEUM[k].looks == "hang"]
    if hangs:
        raise ValueError(f"{hangs} hang: run them with reproduce (a launch of their own, "
                         "with a short timeout)")
    run = launch(_both, WORLD, keys, timeout=timeout)
    return {key: tuple(visit(key, [r[fixed][key] for r in run]) for fixed in (False, True))
            for key in keys}


def reproduce(keys=None, fixed: bool = False, timeout: float = 120.0,
              hang_timeout: float = 2.0) -> dict[str, Visit]:
    """key -> `Visit` of each bug of `keys` (a key, a list, None: all) on 4 ranks, spoiled
    or (``fixed=True``) with its fix. A hang, spoiled, runs alone with `hang_timeout`."""
    keys = _check(keys)
    hangs = [k for k in keys if MUSEUM[k].looks == "hang" and not fixed]
    rest = [k for k in keys if k not in hangs]
    out = {}
    if rest:
        run = launch(on_rank, WORLD, rest, fixed, timeout=timeout)
        out = {key: visit(key, [r[key] for r in run]) for key in rest}
    for key in hangs:
        try:
            run = launch(on_rank, WORLD, [key], fixed, timeout=hang_timeout)
            out[key] = visit(key, [r[key] for r in run])
        except CollectiveTimeout as err:
            out[key] = Visit(key, MUSEUM[key].context(), hung=True, report=str(err))
    return out


DRAW_SALT = "26" + ".museum"


def draw(name: str, among=None) -> str:
    """The museum key a learner's `name` draws from `among` (keys; None: every bug): the
    same name, the same bug."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"draw needs your name, a non-empty string, got {name!r}")
    keys = _check(among)
    # a fixed salt, written so that tools/renumber_lessons.py never moves it: it was the
    # lesson's number once, and a renumbered lesson must not change what a name draws
    digest = hashlib.sha256(f"{DRAW_SALT}/{name.strip()}".encode()).digest()
    return keys[int.from_bytes(digest[:8], "big") % len(keys)]


__all__ = ["BUGS", "FIXES", "MUSEUM", "WORLD", "Bug", "Visit", "before_and_after", "describe",
           "draw", "earliest", "on_rank", "reproduce", "visit"]
