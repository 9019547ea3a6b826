"""minitp.course.labs.load_free: a pipeline step's timeline with the waits a busy machine
caused taken out — checked on timelines written here, in-process: the same step as a
loaded machine and as an idle one ran it."""

import time

import pytest

from minitp.course.labs import load_free
from minitp.runtime import trace

MS = 1e-3


def _event(rank, op, start, end, label=""):
    return trace.Event(rank=rank, op=op, axis="p2p" if op != "compute" else "", shape=(),
                       dtype="float32", nbytes=0, model_bytes=0, start=start * MS,
                       end=end * MS, label=label)


def _one_microbatch(kept_from_a_core_ms: float):
    """p = 2, m = 1, F 20 ms, B 40 ms (set costs, no compute), a hop of 1 ms. Rank 1 waits
    `kept_from_a_core_ms` for a core during its F0; rank 0 idles that much longer, waiting
    for its B0's input. Each rank's own clock (`RankClock`: CPU time and sleep asked for)
    advances by the set costs only."""
    k = kept_from_a_core_ms
    events = [_event(0, "compute", 0, 20, "F0"),
              _event(1, "recv", 0, 21), _event(1, "compute", 21, 41 + k, "F0"),
              _event(1, "compute", 41 + k, 81 + k, "B0"),
              _event(0, "recv", 20, 82 + k), _event(0, "compute", 82 + k, 122 + k, "B0")]
    readings = [{0: 0, 20 * MS: 20 * MS, (82 + k) * MS: 20 * MS, (122 + k) * MS: 60 * MS},
                {0: 0, 21 * MS: 0, (41 + k) * MS: 20 * MS, (81 + k) * MS: 60 * MS}]
    return events, readings


def _units(events):
    return {(e.rank, e.label): (round(e.start / MS, 6), round(e.end / MS, 6))
            for e in events if e.op == "compute"}


@pytest.mark.parametrize("kept_ms", [0.0, 30.0])
def test_the_time_a_rank_waited_for_a_core_is_taken_out_of_every_rank(kept_ms):
    events, delays = _one_microbatch(kept_ms)
    found = _units(load_free.replay(events, delays, p=2, stages=2, placement="loop"))
    assert found == {(0, "F0"): (0, 20), (1, "F0"): (21, 41), (1, "B0"): (41, 81),
                     (0, "B0"): (82, 122)}  # the idle machine's step, waits and all


def test_a_wait_the_schedule_makes_is_kept():
    """Rank 0 idles from F0's end to B0's start (60 ms and a hop each way) on an idle
    machine too: that is the bubble being measured, and it stays."""
    events, delays = _one_microbatch(0.0)
    moved = load_free.replay(events, delays, p=2, stages=2, placement="loop")
    assert _units(moved)[(0, "B0")][0] - _units(moved)[(0, "F0")][1] == pytest.approx(62)


def test_a_rank_clock_counts_the_sleep_asked_for_and_the_cpu_time_not_the_wall_clock():
    """Read at every trace instant inside `sampled`; afterwards the trace's clock is its own."""
    clock, rec = load_free.RankClock(), trace.recorder()
    with load_free.sampled(clock) as readings:
        first = rec.now()
        clock.sleep(0.05)
        time.sleep(0.05)  # not asked for by a unit: a wait, not counted
        second = rec.now()
    assert sorted(readings) == [first, second] and second - first >= 0.1
    assert 0.05 <= readings[second] - readings[first] < 0.09
    assert "now" not in vars(rec)
