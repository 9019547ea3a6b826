"""A pipeline step's timeline with the time a busy machine took away put back: what lesson 12's
measured bubbles are computed from, so that they hold on a loaded CPU.

On a machine whose cores other processes hold (or with more ranks than cores), a rank that
could run often waits for a core: its unit's sleep ends and it is not scheduled, its message
arrives and it is not woken. Each such wait stretches that rank's timeline, and every rank
that waits for its messages idles the same time longer: with two busy loops and other load,
lesson 12's bubbles measured 0.50-0.56 (1F1B) and 0.25-0.30 (ZB-H1) where the models say
0.375 and 0.125 (its assertion allows 0.1 above). So the step is put back together from
what a busy machine cannot stretch:

* each rank's own clock (`RankClock`): its main thread's CPU time plus the sleep its
  units were asked for, read at every instant the trace records (`sampled`). A unit lasts
  what it computed plus its set cost; so does a rank's own work between units. (Taking
  the wall clock less Linux's run_delay instead left stalls that are not waits for a core,
  a page brought back in, say: 2 of 12 lesson-12 checks still failed under load.)
* the waits for another rank (`replay`): a unit that needs another rank's output starts
  once that unit has ended, in its own corrected time, plus the fastest hop measured in
  this step (from a unit's end to the unit it feeds starting, over all such pairs), or
  when its own rank is free, whichever is later.

So what is measured: each rank's order, each unit's compute (CPU time), each rank's own
work between units and the fastest hop; the set costs are counted as set. What is not: a
wait longer than the dependency and the fastest hop explain, which a busy machine causes
(an idle one shows it only as the hop's jitter, under a millisecond), nor compute on
threads other than the rank's main one. The raw timeline is kept beside (``wall_events``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import threading
import time

from ...rules import parse_unit_label, rank_and_chunk, stage_of
from ...runtime import trace


class RankClock:
    """A rank's clock that a busy machine cannot stretch: its main thread's CPU time plus
    the sleep it was asked for (`sleep`). Read from any thread, it is the main thread's."""

    def __init__(self):
        self.asked = 0.0  # seconds of sleep asked for so far
        self._cpu = (time.pthread_getcpuclockid(threading.get_ident())
                     if hasattr(time, "pthread_getcpuclockid") else None)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
        self.asked += seconds  # after: a reading during the sleep is of its start

    def read(self) -> float:
        cpu = time.clock_gettime(self._cpu) if self._cpu is not None else time.thread_time()
        return cpu + self.asked


@contextlib.contextmanager
def sampled(clock: RankClock):
    """While inside: every time this rank's trace reads its clock, `clock` too, as
    {trace instant: clock's reading}."""
    rec, found = trace.recorder(), {}
    now = rec.now

    def sampling_now():
        value = now()
        found[value] = clock.read()
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


def replay(events, readings, p: int, stages: int, placement: str) -> list:
    """`events` (every rank's, on the launch's clock) with each pipeline unit moved to
    where it runs without the waits a busy machine caused (see the module's docstring);
    every other event of a rank moves with the unit before it. `readings`: per rank,
    `sampled`'s {trace instant: its `RankClock`'s reading}."""
    samples = [sorted(found.items()) for found in readings]
    instants = [[t for t, _ in found] for found in samples]

    def own(e, t):  # the rank's own clock at instant t (its last reading by then)
        at = bisect.bisect_right(instants[e.rank], t) - 1
        return samples[e.rank][max(at, 0)][1]

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
