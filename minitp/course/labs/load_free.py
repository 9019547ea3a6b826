"""A pipeline step's timeline with the time a busy machine took away put back: what lesson 12's
measured bubbles are computed from, so that they hold on a loaded CPU.

On a machine whose cores other processes hold (or with more ranks than cores), a rank that
could run often waits for a core: its unit's sleep ends and it is not scheduled, its message
arrives and it is not woken. Each such wait stretches that rank's timeline, and every rank
that waits for its messages idles the same time longer: lesson 12's bubbles measured 0.50
and 0.25 where the model says 0.375 and 0.125, with load from other processes (the
assertion allows 0.1 above). Two corrections, both from measurements:

* each rank's own clock: the launch's clock less the time its main thread spent waiting
  for a core (runnable, not running: Linux's ``run_delay``, /proc/.../schedstat), read at
  every instant the trace records (`sampled`). Where that is not available it is 0;
* the waits for another rank (`replay`): a unit that needs another rank's output starts
  once that unit has ended, in its own corrected time, plus the fastest hop measured in
  this step (from a unit's end to the unit it feeds starting, over all such pairs), or
  when its own rank is free, whichever is later; a unit lasts what it lasted on its own
  clock, and the rest of the time between a rank's units (not spent receiving) is kept.

So what is measured: each unit's duration and each rank's order and own work between units
(less its time without a core), and the fastest hop. What is not: a wait longer than the
dependency and the fastest hop explain, which a busy machine causes (an unloaded one shows
it only as the hop's jitter, well under a millisecond). The raw timeline is kept beside.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import threading

from ...rules import parse_unit_label, rank_and_chunk, stage_of
from ...runtime import trace


def _run_delay_reader():
    """A function giving this thread's seconds waiting for a core so far (0 if unknown)."""
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def read() -> float:
        try:
            with open(path) as f:
                return int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0
    return read


@contextlib.contextmanager
def sampled():
    """While inside: every time this rank's trace reads its clock, the main thread's
    waiting-for-a-core seconds then, as {clock value: seconds}."""
    rec, read, found = trace.recorder(), _run_delay_reader(), {}
    now = rec.now

    def sampling_now():
        # A wait for a core between reading the clock and reading the waits would count
        # as before the instant: read them until no such wait came between (at most 4 tries)
        for _ in range(4):
            waited = read()
            value = now()
            if read() == waited:
                break
        found[value] = waited
        return value

    rec.now = sampling_now
    try:
        yield found
    finally:
        del rec.now  # the class's own again


def _needs(unit, p: int, stages: int, placement: str):
    """(rank, kind, microbatch, chunk) of the unit on another rank whose output `unit`
    (an Event) waits for; None when it waits for none (or for its own rank's)."""
    kind, i, k = parse_unit_label(unit.label)
    stage = stage_of(p, unit.rank, k, placement)
    if kind == "F" and stage > 0:
        source = stage - 1
    elif kind == "B" and stage < stages - 1:
        source = stage + 1
    else:
        return None
    other, chunk = rank_and_chunk(p, source, placement)
    return None if other == unit.rank else (other, kind, i, chunk)


def replay(events, delays, p: int, stages: int, placement: str) -> list:
    """`events` (every rank's, on the launch's clock) with each pipeline unit moved to
    where it runs without the waits a busy machine caused (see the module's docstring);
    every other event of a rank moves with the unit before it. `delays`: per rank,
    `sampled`'s {clock value: seconds waiting for a core}."""
    samples = [sorted(d.items()) for d in delays]
    clocks = [[t for t, _ in found] for found in samples]

    def own(e, t):  # a rank's clock less its waiting for a core (the last sample by t)
        at = bisect.bisect_right(clocks[e.rank], t) - 1
        return t - (samples[e.rank][at][1] if at >= 0 else 0.0)

    units = sorted((e for e in events if e.op == "compute" and parse_unit_label(e.label)),
                   key=lambda e: e.start)
    key = {id(e): (e.rank, *parse_unit_label(e.label)) for e in units}
    by_key = {key[id(e)]: e for e in units}
    hops = [e.start - by_key[d].end for e in units
            if (d := _needs(e, p, stages, placement)) is not None and d in by_key]
    hop = max(0.0, min(hops, default=0.0))
    receives = [e for e in events if e.op == "recv"]
    moved, last = {}, {}  # moved: unit key -> (start, end); last: rank -> its previous unit
    for e in units:
        before, need = last.get(e.rank), _needs(e, p, stages, placement)
        start = e.start if need is None else -float("inf")  # a rank's first unit
        if before is not None:  # its own work since its unit before, not the receiving
            gap = own(e, e.start) - own(before, before.end)
            waited = sum(own(r, r.end) - own(r, r.start) for r in receives
                         if r.rank == e.rank and before.end <= r.start and r.end <= e.start)
            start = moved[key[id(before)]][1] + gap - waited
        if need is not None:
            start = max(start, moved[need][1] + hop)
        moved[key[id(e)]] = (start, start + own(e, e.end) - own(e, e.start))
        last[e.rank] = e
    return _shifted(events, units, moved, key)


def _shifted(events, units, moved, key) -> list:
    """Each unit at its moved place; any other event shifted as the rank's unit before it."""
    shift_at = {}  # rank -> [(raw start, shift)] in order
    for e in units:
        shift_at.setdefault(e.rank, []).append((e.start, moved[key[id(e)]][0] - e.start))
    out = []
    for e in events:
        if id(e) in key:
            start, end = moved[key[id(e)]]
        else:
            shift = next((s for t, s in reversed(shift_at.get(e.rank, [])) if t <= e.start), 0.0)
            start, end = e.start + shift, e.end + shift
        out.append(dataclasses.replace(e, start=start, end=end))
    return out
