"""Bytes on the wire, measured: each Event's ``sent_bytes`` (what the kernel counted
this rank writing, `minitp.runtime.io_counters`) against its ``model_bytes`` (the ring
formula), in real launched processes on gloo, at world sizes 2, 3 and 4.

One launch per world size runs every operation once on tensors of 384 KiB (large
enough that gloo's few header bytes per message are far below 1%; divisible by 3
and by 4, so every rank's share is whole).
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import minitp as mt
from minitp.runtime import comm
from minitp.runtime import io_counters as _io_counters

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [
    pytest.mark.usefixtures("no_leftover_processes"),
    pytest.mark.skipif(not _io_counters.available(),
                       reason="no /proc/self/io: this OS does not count a process's written "
                              "bytes, so minitp records sent_bytes=None (the model only)"),
]

S = 384 * 1024  # bytes of the full tensor of every operation
TOLERANCE = 0.01  # gloo adds a header of a few dozen bytes per message


def _worker():
    rank, n = dist.get_rank(), dist.get_world_size()
    world = mt.world()
    values = S // 4  # float32
    out = {}

    def last(op):
        (e,) = [e for e in mt.trace.events() if e.op == op][-1:]
        return e

    comm.all_reduce(torch.ones(values), world)
    out["all_reduce"] = last("all_reduce")
    comm.all_gather(torch.ones(values // n), world)
    out["all_gather"] = last("all_gather")
    comm.reduce_scatter(torch.ones(values), world)
    out["reduce_scatter"] = last("reduce_scatter")
    comm.broadcast(torch.ones(values), world, src=0)
    out["broadcast"] = last("broadcast")
    comm.all_reduce_start(torch.ones(values), world).wait()  # posted, then waited
    out["all_reduce_async"] = last("all_reduce")
    if rank == 0:
        comm.send(torch.ones(values), 1)
        out["p2p"] = last("send")
    elif rank == 1:
        comm.recv(torch.empty(values), 0)
        out["p2p"] = last("recv")

    # Two ops in flight at once: the per-process counter cannot split them.
    if rank in (0, 1):
        pending = (comm.isend(torch.ones(values), 1) if rank == 0
                   else comm.irecv(torch.empty(values), 0))
    comm.all_reduce(torch.ones(values), world)
    out["overlapped_all_reduce"] = last("all_reduce")
    if rank in (0, 1):
        pending.wait()
        out["overlapped_p2p"] = last("send" if rank == 0 else "recv")

    # An axis of one rank moves nothing: no event, the input comes back.
    alone = mt.Mesh(dp=n, tp=1).tp
    before = len(mt.trace.events())
    same = [comm.all_reduce(torch.ones(3), alone), comm.all_gather(torch.ones(3), alone),
            comm.reduce_scatter(torch.ones(3), alone), comm.broadcast(torch.ones(3), alone),
            comm.all_reduce_start(torch.ones(3), alone).wait()]
    comm.barrier(alone)
    out["alone"] = (len(mt.trace.events()) - before, all(torch.equal(t, torch.ones(3))
                                                         for t in same))
    return out


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def measured(request):
    n = request.param
    return n, mt.launch(_worker, n, timeout=60)


def _close(sent, expected):
    return abs(sent - expected) <= TOLERANCE * expected


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "all_reduce_async"])
def test_ring_collectives_send_what_the_ring_model_says(measured, op):
    n, run = measured
    for r in range(n):
        e = run[r][op]
        assert e.nbytes == S and e.model_bytes > 0
        assert e.sent_bytes is not None, f"rank {r}: {op} was not measured"
        assert _close(e.sent_bytes, e.model_bytes), (
            f"rank {r} {op} at n={n}: sent {e.sent_bytes}, model {e.model_bytes}")


def test_point_to_point_sends_the_message_once(measured):
    _, run = measured
    send, recv = run[0]["p2p"], run[1]["p2p"]
    assert send.model_bytes == S and _close(send.sent_bytes, S)
    # the receiver writes only a "ready" header to the sender: nothing near the message
    assert recv.model_bytes == 0 and 0 <= recv.sent_bytes < TOLERANCE * S


def test_gloo_reduce_scatter_sends_an_all_reduces_bytes(measured):
    # The ring optimum for reduce-scatter is (n-1)/n·S per rank, and that is the
    # model. gloo's reduce_scatter_tensor is not a ring reduce-scatter: it moves
    # 2(n-1)/n·S, what an all-reduce moves (it reduces everything, then keeps a
    # chunk). So on gloo, sequence parallelism (all-gather + reduce-scatter in
    # place of each all-reduce) sends 1.5x plain TP's bytes; on NCCL, whose
    # reduce-scatter is a ring, it sends the same. If a torch update makes this
    # fail, gloo got a ring reduce-scatter: update lesson 05 too.
    n, run = measured
    for r in range(n):
        e = run[r]["reduce_scatter"]
        assert e.model_bytes == (n - 1) * S // n
        assert _close(e.sent_bytes, 2 * e.model_bytes), (
            f"rank {r} at n={n}: sent {e.sent_bytes}, ring model {e.model_bytes}")


def _binomial_sends(r: int, n: int) -> int:
    """Messages rank r sends in a broadcast from rank 0 down a binomial tree: in
    round k every rank that has the data (those below 2^k) sends it to r + 2^k."""
    return sum(1 for k in range(n.bit_length()) if r < 2 ** k and r + 2 ** k < n)


def test_broadcast_moves_n_minus_1_copies_down_a_tree(measured):
    # The model is a chain (each rank but the last forwards S once); gloo uses a
    # binomial tree, so the root sends more than S once n > 2. The total over the
    # ranks is the same, (n-1)·S: every rank but the root receives S once.
    n, run = measured
    events = [run[r]["broadcast"] for r in range(n)]
    assert _close(sum(e.sent_bytes for e in events), sum(e.model_bytes for e in events))
    assert sum(e.model_bytes for e in events) == (n - 1) * S
    for r, e in enumerate(events):
        expected = _binomial_sends(r, n) * S
        assert (e.sent_bytes < TOLERANCE * S) if expected == 0 else _close(e.sent_bytes, expected)
    if n == 2:  # tree and chain agree: the root sends S, the other only a header
        assert _close(events[0].sent_bytes, events[0].model_bytes)
        assert events[1].model_bytes == 0 and events[1].sent_bytes < TOLERANCE * S


def test_overlapping_ops_are_not_measured(measured):
    n, run = measured
    for r in range(n):
        overlapped = run[r]["overlapped_all_reduce"]
        assert overlapped.model_bytes > 0
        assert overlapped.sent_bytes is (None if r in (0, 1) else overlapped.sent_bytes)
        if r in (0, 1):
            assert run[r]["overlapped_p2p"].sent_bytes is None
        else:  # nothing else was in flight on this rank: measured as usual
            assert _close(overlapped.sent_bytes, overlapped.model_bytes)


def test_an_axis_of_one_rank_is_not_traced(measured):
    n, run = measured
    for r in range(n):
        assert run[r]["alone"] == (0, True)


def test_window_refuses_to_split_what_overlaps():
    alone = _io_counters.Window()
    assert alone.close() is not None
    first = _io_counters.Window()
    second = _io_counters.Window()
    assert second.close() is None and first.close() is None
    assert _io_counters.Window(measurable=False).close() is None
    after = _io_counters.Window()
    assert after.close() == 0  # this process wrote nothing meanwhile
