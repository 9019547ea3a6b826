"""Before each collective the ranks compare their calls (minitp.runtime._collective_checks):
calls that do not fit raise the same CollectiveMismatch on every rank, naming every rank's
op, shape and dtype, where gloo returned uninitialised rows or a half-overwritten
broadcast, or aborted one process with its own two sizes. The check is bookkeeping:
it leaves the trace and the measured bytes as they were, and `checks(False)` skips it.

Each scenario runs on real processes. Every rank catches what its call raised and then
runs one more all-reduce: the check raised before anything was sent, so the group is
still usable. The parent sees every rank's outcome, not only the first failure's.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import minitp as mt
from minitp.runtime import comm

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _a2a_asks_for_more(r, n):  # rank 1 expects 5 rows from rank 0, which sends it 2
    return comm.all_to_all(torch.arange(4.0).view(4, 1), mt.world(), [2, 2],
                           [5, 2] if r == 1 else [2, 2])


def _a2a_asks_for_fewer(r, n):  # rank 1 expects 1 row from rank 0, which sends it 2
    return comm.all_to_all(torch.arange(4.0).view(4, 1), mt.world(), [2, 2],
                           [1, 2] if r == 1 else [2, 2])


def _a2a_three_ranks(r, n):
    # every rank sends one row to each; rank 2 expects 3 from rank 0 and 0 from rank 1
    return comm.all_to_all(torch.zeros(3, 2), mt.world(), [1, 1, 1],
                           [3, 0, 1] if r == 2 else [1, 1, 1])


def _broadcast_from_smaller(r, n):
    return comm.broadcast(torch.full((4,) if r == 0 else (8,), 10.0 * (r + 1)), mt.world())


def _broadcast_from_larger(r, n):
    return comm.broadcast(torch.full((8,) if r == 0 else (4,), 10.0 * (r + 1)), mt.world())


def _broadcast_src_differs(r, n):
    return comm.broadcast(torch.full((4,), float(r)), mt.world(), src=r)


def _all_reduce_dtypes(r, n):
    return comm.all_reduce(torch.ones(4, dtype=torch.float32 if r == 0 else torch.float64),
                           mt.world())


def _all_reduce_start_dtypes(r, n):
    return comm.all_reduce_start(
        torch.ones(4, dtype=torch.float32 if r == 0 else torch.float64), mt.world()).wait()


def _all_gather_widths(r, n):
    return comm.all_gather(torch.ones(2, 3 + r), mt.world())


def _all_to_all_widths(r, n):
    return comm.all_to_all(torch.ones(n, 3 + r), mt.world(), [1] * n, [1] * n)


def _different_collectives(r, n):
    x = torch.ones(4)
    return comm.all_reduce(x, mt.world()) if r == 0 else comm.broadcast(x, mt.world())


def _on_a_sub_axis(r, n):
    """Axis of global ranks [1, 2, 3]: splits are indexed along it, names are global."""
    group = dist.new_group([1, 2, 3])  # every rank creates every group
    if r == 0:
        return None
    axis = mt.Axis("sub", (1, 2, 3), r - 1, group)
    return comm.all_to_all(torch.zeros(3, 2), axis, [1, 1, 1],
                           [1, 2, 1] if r == 3 else [1, 1, 1])


def _outcome(scenario):
    r, n = dist.get_rank(), dist.get_world_size()
    try:
        result = ("returned", scenario(r, n))
    except Exception as exc:  # noqa: BLE001 - the parent checks type and message
        result = (type(exc).__name__, str(exc))
    after = comm.all_reduce(torch.ones(2, dtype=torch.float64), mt.world())
    return result, after.tolist()


def _run(scenario, n):
    return list(mt.launch(_outcome, n, scenario, timeout=30))


def _same_error_everywhere(outcomes, n, *lines):
    """Every rank raised CollectiveMismatch with one message holding every line, and the
    group stayed usable."""
    kinds = [kind for (kind, _), _ in outcomes]
    assert kinds == ["CollectiveMismatch"] * len(outcomes), outcomes
    messages = {message for (_, message), _ in outcomes}
    assert len(messages) == 1, messages  # the same words on every rank
    message = messages.pop()
    for line in lines:
        assert line in message, f"{line!r} not in:\n{message}"
    assert all(after == [float(n)] * 2 for _, after in outcomes), outcomes
    return message


def test_all_to_all_receive_splits_asking_for_more_rows_than_are_sent():
    """Before: rank 1 got back rows of uninitialised memory (7.99e-44, -6.38e+29, ...)."""
    _same_error_everywhere(
        _run(_a2a_asks_for_more, 2), 2,
        "rank 1 expects 5 rows from rank 0, which sends it 2",
        "rank 0: all_to_all on axis world ranks [0, 1], shape (4, 1), float32, "
        "send_splits [2, 2], recv_splits [2, 2]",
        "rank 1: all_to_all on axis world ranks [0, 1], shape (4, 1), float32, "
        "send_splits [2, 2], recv_splits [5, 2]")


def test_all_to_all_receive_splits_asking_for_fewer_rows_than_are_sent():
    """Before: gloo aborted rank 1 alone ("8 vs 4")."""
    _same_error_everywhere(_run(_a2a_asks_for_fewer, 2), 2,
                           "rank 1 expects 1 row from rank 0, which sends it 2")


def test_all_to_all_names_every_pair_that_disagrees():
    message = _same_error_everywhere(
        _run(_a2a_three_ranks, 3), 3,
        "rank 2 expects 3 rows from rank 0, which sends it 1",
        "rank 2 expects 0 rows from rank 1, which sends it 1")
    assert message.count("expects") == 2, message


def test_all_to_all_on_a_sub_axis_names_global_ranks():
    outcomes = _run(_on_a_sub_axis, 4)
    assert outcomes[0][0] == ("returned", None)
    _same_error_everywhere(outcomes[1:], 4,
                           "rank 3 expects 2 rows from rank 2, which sends it 1",
                           "rank 1: all_to_all on axis sub ranks [1, 2, 3]")


@pytest.mark.parametrize("scenario,shapes", [
    (_broadcast_from_smaller, ((4,), (8,))),  # before: [10,10,10,10,20,20,20,20] on rank 1
    (_broadcast_from_larger, ((8,), (4,))),  # before: gloo aborted rank 1 alone
])
def test_broadcast_of_different_shapes(scenario, shapes):
    _same_error_everywhere(
        _run(scenario, 2), 2, "broadcast: the ranks of axis world disagree on the shape",
        *(f"rank {r}: broadcast on axis world ranks [0, 1], shape {shape}, float32, src=0"
          for r, shape in enumerate(shapes)))


def test_broadcast_from_a_different_src_on_each_rank():
    _same_error_everywhere(_run(_broadcast_src_differs, 2), 2, "disagree on src",
                           "shape (4,), float32, src=0", "shape (4,), float32, src=1")


@pytest.mark.parametrize("scenario", [_all_reduce_dtypes, _all_reduce_start_dtypes])
def test_an_all_reduce_of_two_dtypes_shows_both(scenario):
    """Before: gloo aborted, and the report said shape (4,) on both ranks: no difference."""
    _same_error_everywhere(
        _run(scenario, 2), 2, "all_reduce: the ranks of axis world disagree on the dtype",
        "rank 0: all_reduce on axis world ranks [0, 1], shape (4,), float32, op='sum'",
        "rank 1: all_reduce on axis world ranks [0, 1], shape (4,), float64, op='sum'")


def test_an_all_gather_of_different_widths_names_every_rank():
    """Before: gloo aborted, and the report named rank 0's shape only."""
    _same_error_everywhere(
        _run(_all_gather_widths, 3), 3, "pad first",
        *(f"rank {r}: all_gather on axis world ranks [0, 1, 2], shape (2, {3 + r}), float32"
          for r in range(3)))


def test_an_all_to_all_of_different_widths_names_every_rank():
    _same_error_everywhere(
        _run(_all_to_all_widths, 3), 3, "disagree on the row shape",
        *(f"rank {r}: all_to_all on axis world ranks [0, 1, 2], shape (3, {3 + r}), float32"
          for r in range(3)))


def test_two_different_collectives_are_named_at_once():
    _same_error_everywhere(
        _run(_different_collectives, 2), 2, "a collective: the ranks of axis world disagree "
        "on the collective", "rank 0: all_reduce on axis world ranks [0, 1], shape (4,)",
        "rank 1: broadcast on axis world ranks [0, 1], shape (4,)")


def _uncaught():
    return _broadcast_from_smaller(dist.get_rank(), 2)


def test_a_launch_reports_every_ranks_call():
    """Uncaught, the launch's error carries the message: both ranks' calls."""
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(_uncaught, 2, timeout=30)
    assert "CollectiveMismatch" in str(info.value), str(info.value)
    for r, shape in enumerate(((4,), (8,))):
        assert f"rank {r}: broadcast on axis world ranks [0, 1], shape {shape}, float32" in (
            str(info.value)), str(info.value)


# --------------------------------------------------------------------------- cost and switch
def _the_same_ops(n):
    world, r = mt.world(), dist.get_rank()
    x = torch.arange(768.0) + r  # 768: divisible by 2, 3 and 4
    comm.all_reduce(x, world)
    comm.all_gather(x, world)
    comm.reduce_scatter(x, world)
    comm.broadcast(x, world, src=n - 1)
    comm.all_to_all(x.view(-1, 4), world, [192 // n] * n)
    comm.all_reduce_start(x, world).wait()
    comm.barrier(world)


def _with_and_without_checks(n):
    calls = []
    real = dist.all_to_all_single

    def counting(*args, **kwargs):  # every all-to-all this process asks of torch
        calls.append(args[0].dtype)
        return real(*args, **kwargs)

    dist.all_to_all_single = counting
    runs = {}
    for on in (True, False, True):
        with comm.checks(on):
            assert comm.enabled() is on
            mt.trace.clear()
            del calls[:]
            _the_same_ops(n)
            events = [(e.op, e.axis, e.shape, e.dtype, e.nbytes, e.model_bytes, e.sent_bytes)
                      for e in mt.trace.events()]
            runs.setdefault(on, []).append((events, len(calls)))
    return runs, comm.enabled()


@pytest.mark.parametrize("n", [2, 3])
def test_the_check_leaves_the_trace_and_its_bytes_as_they_were(n):
    """The same ops with checks on and off: the same events, the same measured bytes,
    and the checks' one exchange (an all-to-all) per collective absent when off: 8
    collectives, the all-to-all's counts first, beside the 2 all-to-alls of the ops."""
    for runs, restored in mt.launch(_with_and_without_checks, n, n, timeout=60):
        assert restored is True  # the setting before the block comes back after it
        (on_events, on_calls), (again, again_calls) = runs[True]
        ((off_events, off_calls),) = runs[False]
        assert len(on_events) == 8 and all(e[-1] is not None for e in on_events), on_events
        assert on_events == off_events == again, (on_events, off_events)
        assert (on_calls, off_calls, again_calls) == (2 + 8, 2, 2 + 8)


def _skips(r, n):
    if r == 0:
        comm.all_reduce(torch.ones(4), mt.world())


def test_a_rank_that_never_comes_is_still_a_timeout_naming_the_op():
    """The others wait in the check's exchange: reported as the op they are in."""
    with pytest.raises(mt.CollectiveTimeout) as info:
        mt.launch(lambda: _skips(dist.get_rank(), 2), 2, timeout=2)
    assert info.value.waiting == {0: "all_reduce on axis world ranks [0, 1], shape (4,)"}
    assert info.value.finished == [1]
    # the hang report: each rank's last collectives, and the one that rank 1 never called
    assert str(info.value).endswith(
        "the first collective the ranks disagree on: #0 on axis world ranks [0, 1]: "
        "rank 0: all_reduce shape (4,) float32; rank 1: never called it")
    assert [e.op for e in info.value.last_collectives[0]] == ["all_reduce"]
