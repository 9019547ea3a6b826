"""minitp.runtime.comm at world sizes 2, 3 and 4: every function against the exact value
computed here from the same inputs, and the Event each call leaves.

Inputs are integer-valued float64 tensors, so every sum is exact whatever order
the ring adds in, and results are compared with equality. One launch per world
size runs every call; the tests below read its results.
"""

from __future__ import annotations

import sys
import time
import warnings
from fractions import Fraction

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import minitp as mt
from minitp.runtime import comm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

WORLD_SIZES = [2, 3, 4]


def ints(rank: int, shape, salt: int) -> torch.Tensor:
    """Rank `rank`'s input for check `salt`: integers in [-50, 50] as float64."""
    gen = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-50, 51, shape, generator=gen).to(torch.float64)


def _sub_axis(n: int):
    """Every rank but 0, as one axis: index i is global rank i + 1 (None on rank 0)."""
    ranks = list(range(1, n))
    group = dist.new_group(ranks)  # every rank must call new_group, members or not
    me = dist.get_rank()
    return mt.Axis("sub", tuple(ranks), me - 1, group) if me in ranks else None


def _comm_worker():
    """`_every_call`'s results, and every warning those calls gave (``"warned"``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # each call's, not only the first of a place
        out = _every_call()
    out["warned"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    return out


def _every_call():
    """Call everything once; return {check: (output, events of that call)} and extras."""
    rank, n = dist.get_rank(), dist.get_world_size()
    world = mt.world()
    sub = _sub_axis(n)
    out = {}

    def record(name, call):
        before = len(mt.trace.events())
        result = call()
        out[name] = (result, mt.trace.events()[before:])
        return result

    x = ints(rank, (3, 4), 1)
    x_before = x.clone()
    record("all_reduce_sum", lambda: comm.all_reduce(x, world))
    out["input_untouched"] = torch.equal(x, x_before)
    record("all_reduce_max", lambda: comm.all_reduce(ints(rank, (3, 4), 2), world, op="max"))
    record("all_reduce_noncontig", lambda: comm.all_reduce(ints(rank, (4, 3), 3).t(), world))
    record("all_gather_0", lambda: comm.all_gather(ints(rank, (2, 3), 4), world, dim=0))
    record("all_gather_last", lambda: comm.all_gather(ints(rank, (2, 3), 5), world, dim=-1))
    record("all_gather_mid", lambda: comm.all_gather(ints(rank, (2, 3, 2), 6), world, dim=1))
    record("reduce_scatter_0",
           lambda: comm.reduce_scatter(ints(rank, (2 * n, 3), 7), world, dim=0))
    record("reduce_scatter_1",
           lambda: comm.reduce_scatter(ints(rank, (2, 3 * n, 2), 8), world, dim=1))
    record("broadcast_last", lambda: comm.broadcast(ints(rank, (5,), 9), world, src=n - 1))
    # the non-blocking forms: same inputs, same results, one event each
    record("all_gather_start_mid",
           lambda: comm.all_gather_start(ints(rank, (2, 3, 2), 6), world, dim=1).wait())
    record("reduce_scatter_start_1",
           lambda: comm.reduce_scatter_start(ints(rank, (2, 3 * n, 2), 8), world, dim=1).wait())
    # posted, then computing for a while: the event spans from the post to the wait
    pending = comm.reduce_scatter_start(ints(rank, (2 * n, 3), 7), world)
    posted = mt.trace.recorder().now()
    time.sleep(0.05)
    record("reduce_scatter_start_0", pending.wait)
    out["posted"] = posted

    if sub is not None:  # src is an index within the axis: index 0 is global rank 1
        record("broadcast_sub", lambda: comm.broadcast(ints(rank, (5,), 10), sub, src=0))
        record("all_reduce_sub", lambda: comm.all_reduce(ints(rank, (6,), 11), sub))
        record("all_gather_sub", lambda: comm.all_gather(ints(rank, (2,), 12), sub))
        record("reduce_scatter_sub",
               lambda: comm.reduce_scatter(ints(rank, (2 * (n - 1),), 13), sub))

    if rank == 0:
        record("send", lambda: comm.send(ints(0, (2, 3), 14), 1))
    elif rank == 1:
        record("recv", lambda: comm.recv(torch.empty(2, 3, dtype=torch.float64), 0))
    record("sendrecv", lambda: comm.sendrecv(
        ints(rank, (4,), 15), (rank + 1) % n, torch.empty(4, dtype=torch.float64), (rank - 1) % n))

    # barrier: nobody leaves before the last rank arrives
    if rank == 0:
        time.sleep(0.3)
    out["barrier_entered"] = time.time()
    record("barrier", lambda: comm.barrier(world))
    out["barrier_left"] = time.time()

    # refusals: raised before any communication, on every rank alike
    errors = {}
    for name, call in {
        "avg": lambda: comm.all_reduce(x, world, op="avg"),
        "mean": lambda: comm.all_reduce(x, world, op="mean"),
        "rs_not_divisible": lambda: comm.reduce_scatter(ints(rank, (2 * n + 1, 2), 16), world),
        "rs_not_divisible_dim1":
            lambda: comm.reduce_scatter(ints(rank, (2, n + 1), 16), world, dim=1),
    }.items():
        before = len(mt.trace.events())
        try:
            call()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - the parent checks type and message
            errors[name] = (type(exc).__name__, str(exc), len(mt.trace.events()) - before)
    out["errors"] = errors

    # phase and label
    record("plain_phase", lambda: comm.all_reduce(torch.ones(2), world))
    with mt.trace.phase("bwd"):
        record("explicit_bwd", lambda: comm.all_reduce(torch.ones(2), world))
    with mt.trace.label("layer0"), mt.trace.label("attn"):
        record("labelled", lambda: comm.all_gather(torch.ones(2), world))
    leaf = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with mt.trace.label("block"):
        record("mapping_backward",
               lambda: (mt.mappings.copy_to_parallel(leaf, world) * (rank + 1)).sum().backward())
    out["mapping_grad"] = leaf.grad
    record("mapping_forward", lambda: mt.mappings.reduce_from_parallel(torch.ones(2), world))
    with mt.trace.phase("fwd"):
        record("explicit_fwd", lambda: comm.all_gather(torch.ones(2), world))
    # backward keeps the label its forward ran under, though it runs after that label ended
    leaf2 = torch.ones(2, dtype=torch.float64, requires_grad=True)
    with mt.trace.label("mlp"):
        branch = mt.mappings.copy_to_parallel(leaf2, world)
    record("backward_after_label", lambda: branch.sum().backward())
    return out


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda n: f"world{n}")
def comm_run(request):
    n = request.param
    return n, mt.launch(_comm_worker, n, timeout=30)


def _one_event(run, r, name, op, axis, shape, nbytes, dtype="float64", phase="", label=""):
    result, events = run[r][name]
    assert len(events) == 1, f"{name} on rank {r}: {len(events)} events"
    (e,) = events
    assert (e.rank, e.op, e.axis, e.shape, e.dtype, e.nbytes, e.phase, e.label) == (
        r, op, axis, tuple(shape), dtype, nbytes, phase, label,
    ), f"{name} on rank {r}: {e}"
    assert 0 <= e.start <= e.end
    return result, e


def _ring(op, n, nbytes) -> int:
    """The ring formula as an exact rational; the tests pick sizes that make it whole."""
    factor = {"all_reduce": Fraction(2 * (n - 1), n),
              "all_gather": Fraction(n - 1, n),
              "reduce_scatter": Fraction(n - 1, n)}[op]
    wire = factor * nbytes
    assert wire.denominator == 1, "pick a size the formula divides"
    return int(wire)


def test_no_collective_warns_that_it_is_deprecated(comm_run):
    """torch 2.13 deprecated all_gather_into_tensor and reduce_scatter_tensor: called,
    they printed a FutureWarning on every rank (under torchrun, where ranks' stderr shows)."""
    for warned in (out["warned"] for out in comm_run[1]):
        assert not [w for w in warned if w.startswith(("FutureWarning", "DeprecationWarning"))]


def test_all_reduce_sum(comm_run):
    n, run = comm_run
    expected = sum(ints(r, (3, 4), 1) for r in range(n))
    for r in range(n):
        result, e = _one_event(run, r, "all_reduce_sum", "all_reduce", "world", (3, 4), 96)
        assert torch.equal(result, expected)
        assert e.model_bytes == _ring("all_reduce", n, 96)
        assert e.group_ranks == tuple(range(n))
        assert run[r]["input_untouched"]


def test_all_reduce_max(comm_run):
    n, run = comm_run
    expected = torch.stack([ints(r, (3, 4), 2) for r in range(n)]).amax(0)
    for r in range(n):
        result, e = _one_event(run, r, "all_reduce_max", "all_reduce", "world", (3, 4), 96)
        assert torch.equal(result, expected)
        assert e.model_bytes == _ring("all_reduce", n, 96)


def test_all_reduce_of_a_non_contiguous_tensor(comm_run):
    n, run = comm_run
    expected = sum(ints(r, (4, 3), 3) for r in range(n)).t()
    for r in range(n):
        result, _ = _one_event(run, r, "all_reduce_noncontig", "all_reduce", "world", (3, 4), 96)
        assert torch.equal(result, expected)


@pytest.mark.parametrize("name,shape,salt,dim", [
    ("all_gather_0", (2, 3), 4, 0),
    ("all_gather_last", (2, 3), 5, -1),
    ("all_gather_mid", (2, 3, 2), 6, 1),
    ("all_gather_start_mid", (2, 3, 2), 6, 1),
])
def test_all_gather(comm_run, name, shape, salt, dim):
    n, run = comm_run
    expected = torch.cat([ints(r, shape, salt) for r in range(n)], dim=dim)
    full_bytes = expected.numel() * 8
    for r in range(n):
        result, e = _one_event(run, r, name, "all_gather", "world", shape, full_bytes)
        assert torch.equal(result, expected)
        assert e.model_bytes == _ring("all_gather", n, full_bytes)


@pytest.mark.parametrize("name,shape,salt,dim", [
    ("reduce_scatter_0", (2, 3), 7, 0),
    ("reduce_scatter_1", (2, 3, 2), 8, 1),
    ("reduce_scatter_start_0", (2, 3), 7, 0),
    ("reduce_scatter_start_1", (2, 3, 2), 8, 1),
])
def test_reduce_scatter(comm_run, name, shape, salt, dim):
    n, run = comm_run
    shape = tuple(s * n if i == dim else s for i, s in enumerate(shape))
    total = sum(ints(r, shape, salt) for r in range(n))
    full_bytes = total.numel() * 8
    for r in range(n):
        result, e = _one_event(run, r, name, "reduce_scatter", "world", shape, full_bytes)
        assert torch.equal(result, total.chunk(n, dim=dim)[r])
        assert e.model_bytes == _ring("reduce_scatter", n, full_bytes)


def test_a_posted_collective_spans_from_its_post_to_its_wait(comm_run):
    n, run = comm_run
    for r in range(n):
        (e,) = run[r]["reduce_scatter_start_0"][1]
        assert e.start <= run[r]["posted"] and e.duration >= 0.05


def test_broadcast_src_is_an_index_within_the_axis(comm_run):
    n, run = comm_run
    for r in range(n):
        result, e = _one_event(run, r, "broadcast_last", "broadcast", "world", (5,), 40)
        assert torch.equal(result, ints(n - 1, (5,), 9))
        # the chain model: n-1, 0, 1, ..., n-2; every rank forwards S but the last
        assert e.model_bytes == (0 if r == n - 2 else 40)
    for r in range(1, n):  # axis "sub" = global ranks 1..n-1, so src=0 is global rank 1
        if n == 2:  # an axis of one rank: the input comes back, nothing is traced
            result, events = run[r]["broadcast_sub"]
            assert torch.equal(result, ints(1, (5,), 10)) and events == []
            continue
        result, e = _one_event(run, r, "broadcast_sub", "broadcast", "sub", (5,), 40)
        assert torch.equal(result, ints(1, (5,), 10))
        assert e.group_ranks == tuple(range(1, n))
        assert e.model_bytes == (0 if r == n - 1 else 40)
    assert "broadcast_sub" not in run[0]


def test_collectives_on_a_sub_axis_involve_only_its_ranks(comm_run):
    n, run = comm_run
    members = range(1, n)
    m = n - 1
    gathered = torch.cat([ints(r, (2,), 12) for r in members])
    scattered = sum(ints(r, (2 * m,), 13) for r in members)
    if m == 1:  # an axis of one rank moves nothing: right results, no events
        for name, expected in [("all_reduce_sub", ints(1, (6,), 11)),
                               ("all_gather_sub", gathered), ("reduce_scatter_sub", scattered)]:
            result, events = run[1][name]
            assert torch.equal(result, expected) and events == [], name
        return
    for r in members:
        result, e = _one_event(run, r, "all_reduce_sub", "all_reduce", "sub", (6,), 48)
        assert torch.equal(result, sum(ints(q, (6,), 11) for q in members))
        assert e.model_bytes == _ring("all_reduce", m, 48)
        result, e = _one_event(run, r, "all_gather_sub", "all_gather", "sub", (2,), 16 * m)
        assert torch.equal(result, gathered)
        assert e.model_bytes == _ring("all_gather", m, 16 * m)
        result, e = _one_event(run, r, "reduce_scatter_sub", "reduce_scatter", "sub",
                               (2 * m,), 16 * m)
        assert torch.equal(result, scattered.chunk(m)[r - 1])
        assert e.model_bytes == _ring("reduce_scatter", m, 16 * m)


def test_send_and_recv(comm_run):
    n, run = comm_run
    result, e = _one_event(run, 0, "send", "send", "p2p", (2, 3), 48)
    assert result is None and e.peer == 1 and e.model_bytes == 48
    result, e = _one_event(run, 1, "recv", "recv", "p2p", (2, 3), 48)
    assert torch.equal(result, ints(0, (2, 3), 14))
    assert e.peer == 0 and e.model_bytes == 0
    assert all("send" not in run[r] and "recv" not in run[r] for r in range(2, n))


def test_sendrecv_in_a_ring(comm_run):
    n, run = comm_run
    for r in range(n):
        result, events = run[r]["sendrecv"]
        assert torch.equal(result, ints((r - 1) % n, (4,), 15))
        fields = [(e.op, e.axis, e.peer, e.nbytes, e.model_bytes, e.shape, e.phase) for e in events]
        assert fields == [
            ("send", "p2p", (r + 1) % n, 32, 32, (4,), ""),
            ("recv", "p2p", (r - 1) % n, 32, 0, (4,), ""),
        ]


def test_barrier_waits_for_every_rank(comm_run):
    n, run = comm_run
    last_arrival = max(run[r]["barrier_entered"] for r in range(n))
    for r in range(n):
        result, e = _one_event(run, r, "barrier", "barrier", "world", (1,), 0, dtype="float32")
        assert result is None and e.model_bytes == 0
        assert run[r]["barrier_left"] >= last_arrival - 0.01  # 10 ms of clock slack
    assert run[0]["barrier_entered"] == last_arrival  # rank 0 slept 0.3 s: it came last


def test_refusals_raise_value_error_without_communicating(comm_run):
    n, run = comm_run
    for r in range(n):
        errors = run[r]["errors"]
        for name in ("avg", "mean"):
            kind, message, events = errors[name]
            assert kind == "ValueError" and "sum" in message and events == 0
        for name in ("rs_not_divisible", "rs_not_divisible_dim1"):
            kind, message, events = errors[name]
            assert kind == "ValueError" and "divisible" in message and events == 0


def test_phase_and_label(comm_run):
    n, run = comm_run
    for r in range(n):
        # a collective called on its own belongs to neither pass: phase ""
        _one_event(run, r, "plain_phase", "all_reduce", "world", (2,), 8, dtype="float32")
        _one_event(run, r, "explicit_bwd", "all_reduce", "world", (2,), 8, dtype="float32",
                   phase="bwd")
        _one_event(run, r, "labelled", "all_gather", "world", (2,), 8 * n, dtype="float32",
                   label="layer0.attn")
        # copy_to_parallel's backward all-reduces inside autograd's backward
        _one_event(run, r, "mapping_backward", "all_reduce", "world", (3,), 24,
                   phase="bwd", label="block")
        assert torch.equal(run[r]["mapping_grad"],
                           torch.full((3,), float(sum(q + 1 for q in range(n))),
                                      dtype=torch.float64))
        _one_event(run, r, "mapping_forward", "all_reduce", "world", (2,), 8, dtype="float32",
                   phase="fwd")
        _one_event(run, r, "explicit_fwd", "all_gather", "world", (2,), 8 * n, dtype="float32",
                   phase="fwd")
        _one_event(run, r, "backward_after_label", "all_reduce", "world", (2,), 16,
                   phase="bwd", label="mlp")


def test_run_trace_holds_every_event_of_every_rank(comm_run):
    n, run = comm_run
    per_rank = [sum(len(v[1]) for v in run[r].values()
                    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], list))
                for r in range(n)]
    assert [sum(1 for e in run.trace if e.rank == r) for r in range(n)] == per_rank


# --------------------------------------------------------------------------- all-to-all
def _splits(r, n, rows):
    """Uneven, with zeros: what rank r sends each rank (a router's counts look like this)."""
    return [((r + 2 * k) % 3) * rows for k in range(n)]


def _all_to_all(rows):
    axis = mt.world()
    r, n = axis.rank, axis.size
    g = torch.Generator().manual_seed(7)
    everyone = [torch.randn(sum(_splits(j, n, rows)), 5, generator=g, dtype=torch.float64)
                for j in range(n)]  # every rank's x, known to all: the reference
    send = _splits(r, n, rows)
    mt.trace.clear()
    got = mt.comm.all_to_all(everyone[r].to(mt.device()), axis, send)
    events = mt.trace.events()
    recv = [_splits(j, n, rows)[r] for j in range(n)]
    explicit = mt.comm.all_to_all(everyone[r].to(mt.device()), axis, send, recv)
    expected = torch.cat([everyone[j].split(_splits(j, n, rows))[r] for j in range(n)])
    return {"error": (got.cpu() - expected).abs().max().item() if got.numel() else 0.0,
            "same": torch.equal(got, explicit), "shape": tuple(got.shape),
            "events": [(e.op, e.model_bytes, e.sent_bytes) for e in events],
            "others": sum(s for k, s in enumerate(send) if k != r) * 5 * 8}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_to_all_with_uneven_splits_delivers_every_run_to_its_rank(n):
    for rank, found in enumerate(mt.launch(_all_to_all, n, 4, timeout=60)):
        assert found["error"] == 0.0, (rank, found)  # rows are moved, never added
        assert found["same"], "recv_splits found by exchange_counts differ from the true ones"
        counts, data = found["events"]
        assert counts[0] == data[0] == "all_to_all"
        assert counts[1] == (n - 1) * 8  # n int64 counts, one stays home
        assert data[1] == found["others"]  # the model: the rows sent to the other ranks


def test_all_to_all_measured_bytes_are_the_model_plus_one_header_per_peer():
    """On gloo every rank sends each other rank one message (a header even when it carries
    no rows): measured = model + (n - 1) headers, the same header for every message."""
    headers = set()
    for rows in (4, 40):
        for found in mt.launch(_all_to_all, 4, rows, timeout=60):
            for _op, model, sent in found["events"]:
                assert sent is not None and sent >= model
                headers.add((sent - model) / 3)
    assert len(headers) == 1 and 0 < headers.pop() <= 256, headers


def _bad_splits(send, x_rows):
    try:
        mt.comm.all_to_all(torch.zeros(x_rows, 2), mt.world(), send)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("send,x_rows,words", [
    ([1, 2], 4, "add up to 3 rows, but x has 4"),
    ([1, 2, 1], 4, "must be 2 counts >= 0"),
    ([5, -1], 4, "must be 2 counts >= 0"),
])
def test_all_to_all_refuses_splits_that_do_not_fit(send, x_rows, words):
    for message in mt.launch(_bad_splits, 2, send, x_rows, timeout=60):
        assert message is not None and words in message, message
