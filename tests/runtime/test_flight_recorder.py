"""The hang report's ring (`minitp.runtime._flight_recorder`), in process: what a rank
writes is what the launcher reads back, the ring keeps only the last `SLOTS`, and the
first disagreement is named only where every rank's ring can tell. The report on real
ranks is checked by the timeout tests (tests/runtime/test_launch_faults.py and
test_collective_checks.py)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import torch

from minitp.runtime import _flight_recorder as fr

WORLD = SimpleNamespace(name="world", ranks=[0, 1])
TP = SimpleNamespace(name="tp", ranks=[0, 1])


def _rings(calls: dict[int, list[tuple]]) -> dict[int, list[fr.Entry]]:
    """Each rank's calls [(op, axis, shape)] written to a shared array as a rank would,
    then read back as the launcher does."""
    array = (ctypes.c_char * (fr.RING_BYTES * len(calls)))()
    for rank, ops in calls.items():
        ring = fr.Ring(array, rank)
        for t, (op, axis, shape) in enumerate(ops):
            ring.entered(op, axis, shape, torch.float32, start=t + rank / 10)
            ring.completed(op, axis)
    return fr.read(array, len(calls))


def test_what_a_rank_writes_the_launcher_reads_the_last_slots_of():
    rings = _rings({0: [("all_reduce", WORLD, (4,))] * (fr.SLOTS + 3), 1: []})
    assert [e.k for e in rings[0]] == list(range(3, fr.SLOTS + 3))  # the oldest overwritten
    assert all(e.done and e.shape == (4,) and e.dtype == "float32" for e in rings[0])
    assert rings[1] == []


def test_the_first_disagreement_is_named_by_its_number_on_its_group():
    rings = _rings({0: [("all_reduce", WORLD, (4,)), ("all_reduce", TP, (2,)),
                        ("all_gather", WORLD, (4,))],
                    1: [("all_reduce", WORLD, (4,)), ("all_reduce", TP, (3,))]})
    # tp's #0 differs in shape (entered before world's #1, which rank 1 never called)
    assert fr.first_disagreement(rings) == (
        "#0 on axis tp ranks [0, 1]: rank 0: all_reduce shape (2,) float32; "
        "rank 1: all_reduce shape (3,) float32")
    report = fr.report(rings)
    assert "the first collective the ranks disagree on: #0 on axis tp" in report


def test_a_call_the_ring_overwrote_is_not_called_missing():
    """Rank 0's ring no longer holds world's #0 (8 calls on tp since): not known, so not
    a disagreement; rank 1 made no call at all since, which its ring does show."""
    rings = _rings({0: [("all_reduce", WORLD, (4,))] + [("barrier", TP, (1,))] * fr.SLOTS,
                    1: [("all_reduce", WORLD, (4,))]})
    assert fr.first_disagreement(rings) == (
        "#0 on axis tp ranks [0, 1]: rank 0: barrier shape (1,) float32; "
        "rank 1: never called it")


def test_all_to_all_rows_may_differ_and_still_agree():
    rings = _rings({0: [("all_to_all", WORLD, (3, 8))], 1: [("all_to_all", WORLD, (5, 8))]})
    assert fr.first_disagreement(rings) is None
    assert "every collective the rings hold agrees" in fr.report(rings)
