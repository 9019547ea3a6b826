"""Traced, device-agnostic collectives and point-to-point messages.

This is the only module that calls ``torch.distributed`` communication. Every
function takes the `Axis` to talk on (never a global group), returns its result
as a new tensor allocated like its input (CPU or GPU alike), and leaves an
`Event` in this rank's trace.

Rules learned on gloo (CPU), torch 2.4 onwards:
  * use the tensor variants (``all_gather_into_tensor``, ``reduce_scatter_tensor``);
    where the installed torch lacks one for this backend we fall back to a
    collective that is correct and say so in the event label;
  * never ``ReduceOp.AVG`` (gloo's reduce-scatter silently returns the SUM on
    torch <= 2.8): sum, then divide;
  * gathers need equal shapes on every rank: pad first.

Bytes: each Event carries ``model_bytes`` (the ring formula) and ``sent_bytes``,
what this process measurably wrote while the op ran (`minitp._io_counters`;
``None`` where that cannot be told apart or counted). An op on an axis of one
rank moves nothing and is not traced: it returns its (copied) input.

Non-blocking forms (``*_start``, ``isend``/``irecv``) return a `Pending`: the op
runs in gloo's (or NCCL's) own thread while this one computes, and its Event
spans from posting to the completed wait.

Why one file: every collective, blocking or not, shares the same few rules (the
tensor variants, sum-then-divide, the traced window that counts bytes, the
timeout translation); apart, each would have to repeat them.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist

from . import _device, trace
from ._io_counters import Window
from .config import ring_wire_bytes
from .errors import RankTimedOut
from .mesh import Axis

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}

# gloo says "Timed out waiting 5000ms for recv operation"; NCCL's watchdog says
# "Watchdog caught collective operation timeout". Either means a peer never came.
_TIMEOUT_PATTERN = re.compile(r"timed out|timeout", re.IGNORECASE)


def all_reduce(x: torch.Tensor, axis: Axis, op: str = "sum") -> torch.Tensor:
    """Every rank of `axis` gets the elementwise reduction (sum by default) of all ranks' `x`."""
    if op not in _REDUCE_OPS:
        hint = " (use op='sum' and divide: gloo mishandles AVG)" if op in ("avg", "mean") else ""
        raise ValueError(f"all_reduce op must be one of {sorted(_REDUCE_OPS)}, got {op!r}{hint}")
    out = x.detach().clone()
    if axis.size == 1:
        return out
    with _traced("all_reduce", axis, out, out.numel() * out.element_size()):
        dist.all_reduce(out, op=_REDUCE_OPS[op], group=axis.group)
    return out


def all_gather(x: torch.Tensor, axis: Axis, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim` (equal shapes on all ranks), on every rank."""
    local, out, dim = _gather_buffers(x, axis, dim)
    if out is None:
        return local.clone()
    with _traced("all_gather", axis, x, out.numel() * out.element_size()):
        dist.all_gather_into_tensor(out, local, group=axis.group)
    return _gathered_along(out, local, axis.size, dim)


def _gather_buffers(x, axis: Axis, dim: int):
    """The contiguous input, the (n*d0, ...) output the backends want (rank r's
    tensor is its r-th block; None on an axis of one rank), and `dim` made positive."""
    local = x.detach().contiguous()
    if axis.size == 1:
        return local, None, dim % x.dim()
    out = torch.empty((axis.size * local.shape[0], *local.shape[1:]), dtype=x.dtype,
                      device=x.device)
    return local, out, dim % x.dim()


def _gathered_along(out, local, n: int, dim: int) -> torch.Tensor:
    if dim == 0:
        return out  # already in place
    # (n, ..., d, ...) -> (..., n, d, ...) -> (..., n*d, ...): rank r's block lands r-th
    shape = list(local.shape)
    shape[dim] *= n
    return out.view(n, *local.shape).movedim(0, dim).reshape(shape)


def reduce_scatter(x: torch.Tensor, axis: Axis, dim: int = 0) -> torch.Tensor:
    """Sum `x` over the ranks of `axis`; rank i keeps the i-th of n equal chunks along `dim`."""
    flat, out = _scatter_buffers(x, axis, dim)
    if out is None:
        return x.detach().clone()
    with _traced("reduce_scatter", axis, x, flat.numel() * flat.element_size()):
        dist.reduce_scatter_tensor(out, flat, op=dist.ReduceOp.SUM, group=axis.group)
    return out


def _scatter_buffers(x, axis: Axis, dim: int):
    """The input laid out chunk-first as the backends want it, (n*c0, ...), and the
    output chunk (both None on an axis of one rank)."""
    n = axis.size
    dim = dim % x.dim()
    if x.shape[dim] % n:
        raise ValueError(
            f"reduce_scatter: dimension {dim} of shape {tuple(x.shape)} is not divisible "
            f"by the {axis.name} size {n}"
        )
    if n == 1:
        return None, None
    # (..., n*c, ...) -> (..., n, c, ...) -> (n, ..., c, ...): chunk i first, for rank i.
    # Its rank-i slice is then exactly the output's layout, so no copy afterwards.
    shape = list(x.shape)
    split = shape[:dim] + [n, shape[dim] // n] + shape[dim + 1:]
    chunks_first = x.detach().reshape(split).movedim(dim, 0).contiguous()
    out = torch.empty(chunks_first.shape[1:], dtype=x.dtype, device=x.device)
    return chunks_first.view(n * out.shape[0], *out.shape[1:]), out


def broadcast(x: torch.Tensor, axis: Axis, src: int = 0) -> torch.Tensor:
    """Every rank of `axis` gets the `x` of the rank at index `src` *within the axis*."""
    if not 0 <= src < axis.size:
        raise ValueError(f"broadcast src must be an index in 0..{axis.size - 1}, got {src}")
    out = x.detach().clone()
    if axis.size == 1:
        return out
    with _traced("broadcast", axis, out, out.numel() * out.element_size(), src=src):
        dist.broadcast(out, src=axis.ranks[src], group=axis.group)
    return out


def send(x: torch.Tensor, dst: int) -> None:
    """Send `x` to global rank `dst` (blocks until the message is handed over)."""
    payload = x.detach().contiguous()
    with _traced("send", None, payload, payload.numel() * payload.element_size(), peer=dst):
        dist.send(payload, dst)


def recv(x: torch.Tensor, src: int) -> torch.Tensor:
    """Receive into `x` (its shape and dtype say what to expect) from global rank `src`."""
    if not x.is_contiguous():
        raise ValueError("recv needs a contiguous buffer")
    with _traced("recv", None, x, x.numel() * x.element_size(), peer=src):
        dist.recv(x, src)
    return x


def sendrecv(x: torch.Tensor, dst: int, out: torch.Tensor, src: int) -> torch.Tensor:
    """Send `x` to global rank `dst` while receiving into `out` from global rank `src`.

    Both messages are posted at once, so a ring of ranks that all send to the
    next and receive from the previous cannot deadlock (with blocking `send`
    first on every rank, each would wait for a receiver that never comes).
    Records a send and a recv event. They share one measuring window: the send
    event's ``sent_bytes`` is all this rank wrote meanwhile (its message, and the
    few header bytes with which the receive tells `src` it is ready); the recv
    event's is None, as it cannot be told apart.
    """
    if not out.is_contiguous():
        raise ValueError("sendrecv needs a contiguous receive buffer")
    payload = x.detach().contiguous()
    rec = trace.recorder()
    start = rec.now()
    with _traced("send", None, payload, payload.numel() * payload.element_size(), peer=dst):
        ops = [dist.P2POp(dist.isend, payload, dst), dist.P2POp(dist.irecv, out, src)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    _record_p2p("recv", out, src, start)
    return out


class Pending:
    """A message or collective in flight. ``wait()`` finishes it, records its Event
    (from when it was posted to when it completed) and returns the result.

    Posting and waiting apart is what lets a pipeline stage hand an activation
    to the next stage and go on computing, and what lets a data-parallel
    all-reduce run while backward goes on (gloo progresses it in its own thread).

    Its bytes are counted from just before it is posted to the end of its wait,
    in every thread of the process; if any other op was in flight meanwhile,
    ``sent_bytes`` is None (see `minitp._io_counters.Window`).
    `post` starts the work (None: nothing to do, no event: an axis of one rank);
    `then`, if given, makes the returned result from the filled buffer.
    """

    def __init__(self, post, op, axis: Axis | None, tensor, nbytes, peer=None, result=None,
                 then=None, via: str = "p2p"):
        self.result, self.then = result, then
        self.done = post is None
        if self.done:
            return
        rec = trace.recorder()
        # what the event belongs to is decided where it was posted, not where it is waited on
        self.posted, self.phase, self.label = rec.now(), trace.current_phase(), rec.label
        window = Window(measurable=tensor.device.type == "cpu")
        # `post` closes over the buffers the backend reads and writes: kept (with them)
        # until the wait, whatever the backend's Work itself holds on to
        self.post = post
        try:
            self.work = post()
        except BaseException:
            window.close()
            raise
        self.traced = _traced(op, axis, tensor, nbytes, peer=peer, window=window, via=via)

    def wait(self):
        if self.done:
            return self.result
        with trace.relabel(self.label), trace.phase(self.phase):
            with self.traced as t:
                t.start = self.posted
                self.work.wait()
        self.done = True
        if self.then is not None:  # e.g. a gather along dim > 0: blocks moved into place
            self.result = self.then(self.result)
        self.work = self.traced = self.post = None  # the result is all that is left
        return self.result


def isend(x: torch.Tensor, dst: int, tag: int = 0, via: str = "p2p") -> Pending:
    """Start sending `x` to global rank `dst`; returns at once. Keep the `Pending`
    and `wait()` on it before the step ends (the message holds `x` until then).
    `via`: the axis name its Event carries — "p2p" for the pipeline's messages, the
    ring's axis ("cp", "tp") for a ring built from sends — so bytes are counted
    under the parallelism that sent them."""
    payload = x.detach().contiguous()
    return Pending(lambda: dist.isend(payload, dst, tag=tag), "send", None, payload,
                   payload.numel() * payload.element_size(), peer=dst, result=payload, via=via)


def irecv(x: torch.Tensor, src: int, tag: int = 0, via: str = "p2p") -> Pending:
    """Start receiving into `x` from global rank `src`; ``wait()`` returns `x` filled.
    Messages between two ranks are matched by `tag`, so several kinds of message
    (activations, gradients, of different microbatches) may be in flight at once.
    `via`: as `isend`'s."""
    if not x.is_contiguous():
        raise ValueError("irecv needs a contiguous buffer")
    return Pending(lambda: dist.irecv(x, src, tag=tag), "recv", None, x,
                   x.numel() * x.element_size(), peer=src, result=x, via=via)


def all_reduce_start(x: torch.Tensor, axis: Axis) -> Pending:
    """Start summing `x` over `axis` in the background; ``wait()`` returns the sum
    (a new tensor). The Event spans from the start to the completed wait."""
    out = x.detach().clone()
    post = None if axis.size == 1 else (
        lambda: dist.all_reduce(out, group=axis.group, async_op=True))
    return Pending(post, "all_reduce", axis, out, out.numel() * out.element_size(), result=out)


def all_gather_start(x: torch.Tensor, axis: Axis, dim: int = 0) -> Pending:
    """Start `all_gather` in the background; ``wait()`` returns what it returns. How
    ZeRO-3 fetches the next unit's parameters while this one computes."""
    local, out, dim = _gather_buffers(x, axis, dim)
    if out is None:
        return Pending(None, "all_gather", axis, x, 0, result=local.clone())
    return Pending(lambda: dist.all_gather_into_tensor(out, local, group=axis.group,
                                                       async_op=True),
                   "all_gather", axis, x, out.numel() * out.element_size(), result=out,
                   then=lambda o: _gathered_along(o, local, axis.size, dim))


def reduce_scatter_start(x: torch.Tensor, axis: Axis, dim: int = 0) -> Pending:
    """Start `reduce_scatter` (sum) in the background; ``wait()`` returns this rank's
    chunk. How ZeRO-2/3 reduce a unit's gradient while backward goes on."""
    flat, out = _scatter_buffers(x, axis, dim)
    if out is None:
        return Pending(None, "reduce_scatter", axis, x, 0, result=x.detach().clone())
    return Pending(lambda: dist.reduce_scatter_tensor(out, flat, op=dist.ReduceOp.SUM,
                                                      group=axis.group, async_op=True),
                   "reduce_scatter", axis, x, flat.numel() * flat.element_size(), result=out)


def _record_p2p(op, tensor, peer, start) -> None:
    rec = trace.recorder()
    nbytes = tensor.numel() * tensor.element_size()
    rec.add(
        op=op, axis="p2p", shape=tuple(tensor.shape),
        dtype=str(tensor.dtype).removeprefix("torch."), nbytes=nbytes,
        model_bytes=ring_wire_bytes(op, nbytes, 2), start=start, end=rec.now(),
        phase=trace.current_phase(), peer=peer,
    )


def barrier(axis: Axis) -> None:
    """Wait until every rank of `axis` arrives (an empty all-reduce, traced)."""
    if axis.size == 1:
        return
    token = torch.zeros(1, device=_device.device())  # NCCL needs it on this rank's GPU
    with _traced("barrier", axis, token, 0):
        dist.all_reduce(token, group=axis.group)


def _model_bytes(op: str, nbytes: int, axis: Axis | None, src: int) -> int:
    """The ring model of what this rank sends (`minitp.config.ring_wire_bytes`),
    except a broadcast, whose chain from `src` has every rank send S but the last."""
    if op == "barrier":
        return 0
    if op == "broadcast":
        return 0 if (axis.rank - src) % axis.size == axis.size - 1 else nbytes
    return ring_wire_bytes(op, nbytes, axis.size if axis else 2)


class _traced:
    """Context manager: mark this rank as waiting in `op`, time it, count the bytes
    this process writes meanwhile, record the Event. `window`: one already opened
    (by `Pending`, when the op was posted)."""

    def __init__(self, op, axis: Axis | None, tensor, nbytes, peer=None, src=0, window=None,
                 via: str = "p2p"):
        self.op, self.axis, self.tensor, self.nbytes, self.peer = op, axis, tensor, nbytes, peer
        self.src, self.window, self.via = src, window, via  # via: a send's axis name

    def describe(self) -> str:
        where = f"axis {self.axis.name} ranks {list(self.axis.ranks)}" if self.axis else (
            f"peer rank {self.peer}"
        )
        return f"{self.op} on {where}, shape {tuple(self.tensor.shape)}"

    def __enter__(self):
        self.rec = trace.recorder()
        self.rec.enter(self.describe)
        self.start = self.rec.now()
        if self.window is None:
            self.window = Window(measurable=self.tensor.device.type == "cpu")
        return self

    def __exit__(self, exc_type, exc, tb):
        sent = self.window.close()
        if exc is not None:
            if _TIMEOUT_PATTERN.search(str(exc)):
                # Keep the status slot set: the launcher reads it to name every waiting
                # rank, including ranks whose own report it has not read yet.
                raise RankTimedOut(self.describe(), str(exc).strip()) from exc
            self.rec.leave()
            return False
        self.rec.leave()
        self.rec.add(
            op=self.op,
            axis=self.axis.name if self.axis else self.via,
            shape=tuple(self.tensor.shape),
            dtype=str(self.tensor.dtype).removeprefix("torch."),
            nbytes=int(self.nbytes),
            model_bytes=_model_bytes(self.op, int(self.nbytes), self.axis, self.src),
            sent_bytes=sent,
            start=self.start,
            end=self.rec.now(),
            phase=trace.current_phase(),
            peer=self.peer,
            group_ranks=tuple(self.axis.ranks) if self.axis else (),
        )
        return False
