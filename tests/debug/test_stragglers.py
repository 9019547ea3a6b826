"""`mt.debug.stragglers`: a rank slowed on purpose is the one the others waited for; a
run without a trace is refused in one line."""

from __future__ import annotations

import time

import pytest
import torch

import minitp as mt
from minitp.runtime.trace import Event

SLOW_RANK, SLEEP_S = 2, 0.3


def _rank_two_sleeps():
    world = mt.world()
    mt.comm.all_reduce(torch.ones(4), world)  # everyone past their start
    if world.rank == SLOW_RANK:
        time.sleep(SLEEP_S)  # the straggler: late to the next collective
    mt.comm.all_reduce(torch.ones(4), world)
    mt.comm.all_gather(torch.ones(2), world)


def test_the_rank_slowed_on_purpose_is_the_one_the_others_waited_for():
    report = mt.debug.stragglers(mt.launch(_rank_two_sleeps, 3, timeout=60))
    assert report.straggler == SLOW_RANK, str(report)
    late = report.collectives[1]  # the all-reduce after the sleep
    assert (late.op, late.index, late.last) == ("all_reduce", 1, SLOW_RANK), str(report)
    for rank in (0, 1):  # each waited about the sleep, in that collective and in all
        assert late.waits[rank] > SLEEP_S / 2 and report.waiting[rank] > SLEEP_S / 2
    assert report.waited_for[SLOW_RANK] > SLEEP_S  # two ranks waited for it
    assert report.computing[SLOW_RANK] > SLEEP_S * 0.9  # its sleep counts as computing
    assert report.waiting[SLOW_RANK] < report.waiting[0]
    assert f"the slowest: rank {SLOW_RANK}" in str(report)


def _event(rank, op, start, end, group=(0, 1)):
    return Event(rank=rank, op=op, axis="world" if op != "compute" else "", shape=(4,),
                 dtype="float32", nbytes=16, model_bytes=16, start=start, end=end,
                 group_ranks=group if op != "compute" else ())


def test_a_run_without_a_collective_is_refused_in_one_line():
    with pytest.raises(ValueError, match="holds no collective") as info:
        mt.debug.stragglers([_event(0, "compute", 0.0, 1.0)])
    assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match="needs a run") as info:
        mt.debug.stragglers("run")
    assert "\n" not in str(info.value)


def test_computing_is_the_span_outside_collectives_in_flight_together():
    """Two collectives overlapping on rank 0 (one started without waiting) count once."""
    events = [_event(0, "all_reduce", 0.0, 2.0), _event(0, "all_gather", 1.0, 3.0),
              _event(0, "compute", 3.0, 4.0), _event(1, "all_reduce", 0.5, 2.0),
              _event(1, "all_gather", 1.0, 3.0)]
    report = mt.debug.stragglers(events)
    assert report.computing == {0: 1.0, 1: 0.0}
    assert report.waiting == {0: 0.5, 1: 0.0} and report.waited_for == {0: 0.0, 1: 0.5}
