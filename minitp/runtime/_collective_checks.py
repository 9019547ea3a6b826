"""Before a collective runs, the ranks of its axis tell each other what each is about to
do, and refuse together if their calls do not fit.

Why: gloo and NCCL compare only byte counts, and only where a message arrives short of
its buffer. A broadcast from a tensor smaller than a receiver's overwrites the start of
the receiver's and leaves the rest; an all-to-all whose receive splits ask for more rows
than are sent returns uninitialised memory for the rest; an all-reduce of float32 on one
rank and float64 on another passes the byte check on one of them. Where the sizes do
disagree, gloo aborts one process with only its own two numbers. So every rank gathers
every rank's call (op, dtype, shape, its `src`/`dim`/reduce op, the all-to-all splits):
one exchange of 14 + 2n integers; if the calls do not fit, every rank raises the same
`CollectiveMismatch`, which names each rank's call, before anything else is sent.

The exchange is bookkeeping, not the op. It records no Event (tests and lessons count
collectives and bytes from the trace and compare them with formulas) and it runs before
the op's measuring window opens, so its bytes are not in the op's ``sent_bytes``. It
goes over the group's CPU side (gloo) where the group has one, as minitp's NCCL groups
do (``cpu:gloo,cuda:nccl``), else as a small tensor on this rank's device.

`checks(False)` turns it off inside a ``with`` block, to time the ops alone
(bench/collective_checks.py measures what the checks cost). The setting is this
process's, as the trace recorder is: every rank of a group must be inside the same
``with`` (a rank that checks alone reads the other's payload as a check, and raises).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import _device, _flight_recorder, trace
from ._traced_op import TIMEOUT_PATTERN, describe
from .errors import CollectiveMismatch, RankTimedOut
from .io_counters import Window
from .mesh import Axis

_enabled = True  # the process's setting; changed only by `checks`, which restores it

_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier")
# every dtype this torch has, in one order that all ranks (the same torch) share
_DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)},
                       key=str))
_REDUCE = ("sum", "max", "min", "prod")
_ARG = {"all_reduce": "op", "all_gather": "dim", "reduce_scatter": "dim", "broadcast": "src"}
_MAGIC = 0x6D696E697470  # "minitp": a row without it was not sent by a check
_DIMS = 8  # dims sent in full; a tensor of more is compared by its first 8 and its numel
_HEAD = 6  # magic, op, dtype, ndim, numel, arg
_SHOWN = 8  # mismatched pairs of splits listed before "... and N more"


@contextlib.contextmanager
def checks(enabled: bool = True):
    """Check (default) or not, inside the block, that the ranks' calls of each collective
    agree; the setting before the block comes back after it. Every rank of a group must
    use the same setting: ``with mt.comm.checks(False): ...`` in the launched function."""
    global _enabled
    was, _enabled = _enabled, bool(enabled)
    try:
        yield
    finally:
        _enabled = was


def enabled() -> bool:
    """Whether collectives check that the ranks' calls agree (see `checks`)."""
    return _enabled


@dataclass(frozen=True)
class _Call:
    op: str
    dtype: str
    shape: tuple[int, ...]
    numel: int
    arg: int
    send: tuple[int, ...]
    recv: tuple[int, ...]

    def text(self, axis: Axis) -> str:
        """As the launcher names the op a rank waits in, and what else must agree."""
        shape = self.shape if len(self.shape) <= _DIMS else (*self.shape, "...")
        what = f"{describe(self.op, axis, shape)}, {self.dtype}"
        if self.op in _ARG:
            value = _REDUCE[self.arg] if self.op == "all_reduce" else self.arg
            what += f", {_ARG[self.op]}={value!r}"
        if self.op == "all_to_all":
            what += f", send_splits {list(self.send)}, recv_splits {list(self.recv)}"
        return what


def agree(op: str, axis: Axis, tensor: torch.Tensor, arg=0, send=None, recv=None) -> float:
    """Raise `CollectiveMismatch` on every rank of `axis` if the ranks' calls of `op`
    do not fit together. `arg`: all_reduce's reduce op (a name), a gather's or
    scatter's dim, a broadcast's src; `send`/`recv`: an all-to-all's splits.

    Returns when this rank entered the op, before the check: the op's Event starts
    there, so time spent waiting for a late peer stays inside the op, as without it."""
    start = trace.recorder().now()
    if axis.size > 1:  # checked or not: what a timeout's report lists (`_flight_recorder`)
        _flight_recorder.entered(op, axis, tensor, start)
    if not _enabled or axis.size == 1:
        return start
    n = axis.size
    code = _REDUCE.index(arg) if op == "all_reduce" else int(arg)
    shape = tuple(tensor.shape)
    dims = list(shape[:_DIMS]) + [0] * (_DIMS - min(len(shape), _DIMS))
    mine = [_MAGIC, _OPS.index(op), _DTYPES.index(tensor.dtype), len(shape), tensor.numel(),
            code, *dims, *(send or [0] * n), *(recv or [0] * n)]
    rows = _exchange(mine, axis, lambda: describe(op, axis, shape))
    if not _fit(rows, n):
        raise CollectiveMismatch(_disagreement([_decode(row, n) for row in rows], axis))
    return start


def _fit(rows: list[list[int]], n: int) -> bool:
    """Whether the calls fit, read straight from the rows: the common case, on every
    collective, costs a few comparisons (the message is worked out only for a misfit)."""
    first = rows[0]
    if first[0] != _MAGIC:
        return False
    if first[1] != _OPS.index("all_to_all"):
        return all(row == first for row in rows)
    # rows may differ in dim 0 and numel, and in the splits, which must pair up instead
    split = _HEAD + _DIMS
    same = [first[:4], first[5:_HEAD], first[_HEAD + 1:split]]  # all but numel and dim 0
    return all([row[:4], row[5:_HEAD], row[_HEAD + 1:split]] == same for row in rows) \
        and all(rows[j][split + n + k] == rows[k][split + j]
                for j in range(n) for k in range(n))


def _exchange(mine: list[int], axis: Axis, what) -> list[list[int]]:
    group = axis.group if axis.group is not None else dist.group.WORLD
    types = getattr(group, "_device_types", None)  # what the group's backends take
    cpu = types is None or torch.device("cpu") in types
    device = torch.device("cpu") if cpu else _device.device()
    # Every rank's row to every rank: an all-to-all of n copies, which gloo sends to all
    # peers at once, where its all-gather passes the rows round a ring, n - 1 hops in turn
    # (on 4 ranks the all-to-all took half the time: bench/collective_checks.py).
    local = torch.tensor(mine * axis.size, dtype=torch.int64, device=device)
    out = torch.empty_like(local)
    rec = trace.recorder()
    rec.enter(what)  # a rank that never comes: the launcher names the op the others wait in
    # Opening a window marks any op in flight as sharing the counter with this exchange.
    window = Window(measurable=False)
    try:
        dist.all_to_all_single(out, local, group=axis.group)
    except Exception as exc:
        if TIMEOUT_PATTERN.search(str(exc)):
            raise RankTimedOut(what(), str(exc).strip()) from exc  # the status slot stays set
        rec.leave()
        raise
    finally:
        window.close()
    rec.leave()
    return out.view(axis.size, -1).tolist()


def _decode(row: list[int], n: int) -> _Call | None:
    if row[0] != _MAGIC or not 0 <= row[1] < len(_OPS) or not 0 <= row[2] < len(_DTYPES):
        return None
    ndim = row[3]
    dims = row[_HEAD:_HEAD + _DIMS]
    split = _HEAD + _DIMS
    return _Call(op=_OPS[row[1]], dtype=str(_DTYPES[row[2]]).removeprefix("torch."),
                 shape=tuple(dims[:ndim]), numel=row[4], arg=row[5],
                 send=tuple(row[split:split + n]), recv=tuple(row[split + n:split + 2 * n]))


def _disagreement(calls: list[_Call | None], axis: Axis) -> str:
    """The message every rank raises (the same on each: they all hold every call)."""
    ranks = axis.ranks
    lost = [ranks[i] for i, c in enumerate(calls) if c is None]
    if lost:
        return (f"a collective on axis {axis.name} ranks {list(ranks)}: rank(s) {lost} did "
                "not send the check every rank "
                "sends before a collective: they called something else here (a send, a "
                "collective outside mt.comm), or run with another mt.comm.checks setting")
    first = calls[0]
    each = "\n".join(f"  rank {r}: {c.text(axis)}" for r, c in zip(ranks, calls, strict=True))
    fields = _differing(calls)
    if fields:
        rule = ("Every rank of a group must call the same collective, in the same order, "
                "with the same " + ("row shape (all but dim 0)" if first.op == "all_to_all"
                                    else "shape") + ", dtype and arguments.")
        if first.op == "all_gather" and "the shape" in fields:
            rule += " all_gather needs equal shapes on every rank: pad first."
        op = first.op if "the collective" not in fields else "a collective"
        return (f"{op}: the ranks of axis {axis.name} disagree on {' and '.join(fields)}:\n"
                f"{each}\n{rule}")
    # rank j's recv_splits[k] must equal what rank k sends it, send_splits[j] on rank k
    wrong = [f"  rank {ranks[j]} expects {_rows(calls[j].recv[k])} from rank {ranks[k]}, "
             f"which sends it {calls[k].send[j]}"
             for j in range(len(calls)) for k in range(len(calls))
             if calls[j].recv[k] != calls[k].send[j]]
    if first.op != "all_to_all" or not wrong:  # not reached while _fit and this agree
        return f"{first.op}: the calls of the ranks of axis {axis.name} do not fit:\n{each}"
    if len(wrong) > _SHOWN:
        wrong = wrong[:_SHOWN] + [f"  ... and {len(wrong) - _SHOWN} more"]
    return (f"all_to_all: the splits of the ranks of axis {axis.name} do not match:\n"
            + "\n".join(wrong) + f"\n{each}\n"
            "The j-th rank's recv_splits[k] must be the k-th rank's send_splits[j] "
            "(j, k: places along the axis); leave recv_splits out and exchange_counts "
            "finds them.")


def _rows(count: int) -> str:
    return f"{count} row" + ("" if count == 1 else "s")


def _differing(calls: list[_Call]) -> list[str]:
    def differ(key) -> bool:
        return len({key(c) for c in calls}) > 1

    if differ(lambda c: c.op):
        return ["the collective"]
    rows_apart = calls[0].op == "all_to_all"  # rows (dim 0) differ; the row's shape may not
    fields = []
    if differ(lambda c: c.dtype):
        fields.append("the dtype")
    if differ(lambda c: c.shape[1:] if rows_apart else (c.shape, c.numel)):
        fields.append("the row shape" if rows_apart else "the shape")
    if calls[0].op in _ARG and differ(lambda c: c.arg):
        fields.append(_ARG[calls[0].op])
    return fields
