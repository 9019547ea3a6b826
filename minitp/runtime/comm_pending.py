"""Messages and collectives in flight: `Pending`, posted now and waited on later, and
the non-blocking forms that return one (``isend``/``irecv``, ``*_start``), all reached
as `minitp.runtime.comm`'s names."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import trace
from ._collective_checks import agree
from ._comm_buffers import gather_buffers, gathered_along, scatter_buffers
from ._traced_op import TracedOp
from .io_counters import Window
from .mesh import Axis


class Pending:
    """A message or collective in flight. ``wait()`` finishes it, records its Event
    (from when it was posted to when it completed) and returns the result.

    Posting and waiting apart is what lets a pipeline stage hand an activation
    to the next stage and go on computing, and what lets a data-parallel
    all-reduce run while backward goes on (gloo progresses it in its own thread).

    Its bytes are counted from just before it is posted to the end of its wait,
    in every thread of the process; if any other op was in flight meanwhile,
    ``sent_bytes`` is None (see `minitp.runtime.io_counters.Window`).
    `post` starts the work (None: nothing to do, no event: an axis of one rank);
    `then`, if given, makes the returned result from the filled buffer; `posted`: when
    this rank entered the op, if before this (its ranks' calls were compared first).
    """

    def __init__(self, post, op, axis: Axis | None, tensor, nbytes, peer=None, result=None,
                 then=None, via: str = "p2p", posted=None):
        self.result, self.then = result, then
        self.done = post is None
        if self.done:
            return
        rec = trace.recorder()
        # what the event belongs to is decided where it was posted, not where it is waited on
        self.posted = rec.now() if posted is None else posted
        self.phase, self.label = trace.current_phase(), rec.label
        window = Window(measurable=tensor.device.type == "cpu")
        # `post` closes over the buffers the backend reads and writes: kept (with them)
        # until the wait, whatever the backend's Work itself holds on to
        self.post = post
        try:
            self.work = post()
        except BaseException:
            window.close()
            raise
        self.traced = TracedOp(op, axis, tensor, nbytes, peer=peer, window=window, via=via)

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
    posted = agree("all_reduce", axis, out, "sum")  # before the post: it cannot be taken back
    post = None if axis.size == 1 else (
        lambda: dist.all_reduce(out, group=axis.group, async_op=True))
    return Pending(post, "all_reduce", axis, out, out.numel() * out.element_size(), result=out,
                   posted=posted)


def all_gather_start(x: torch.Tensor, axis: Axis, dim: int = 0) -> Pending:
    """Start `all_gather` in the background; ``wait()`` returns what it returns. How
    ZeRO-3 fetches the next unit's parameters while this one computes."""
    local, out, dim = gather_buffers(x, axis, dim)
    if out is None:
        return Pending(None, "all_gather", axis, x, 0, result=local.clone())
    posted = agree("all_gather", axis, x, dim)
    return Pending(lambda: dist.all_gather_single(out, local, group=axis.group,
                                                   async_op=True),
                   "all_gather", axis, x, out.numel() * out.element_size(), result=out,
                   then=lambda o: gathered_along(o, local, axis.size, dim), posted=posted)


def reduce_scatter_start(x: torch.Tensor, axis: Axis, dim: int = 0) -> Pending:
    """Start `reduce_scatter` (sum) in the background; ``wait()`` returns this rank's
    chunk. How ZeRO-2/3 reduce a unit's gradient while backward goes on."""
    flat, out = scatter_buffers(x, axis, dim)
    if out is None:
        return Pending(None, "reduce_scatter", axis, x, 0, result=x.detach().clone())
    posted = agree("reduce_scatter", axis, x, dim % x.dim())
    return Pending(lambda: dist.reduce_scatter_single(out, flat, op=dist.ReduceOp.SUM,
                                                      group=axis.group, async_op=True),
                   "reduce_scatter", axis, x, flat.numel() * flat.element_size(), result=out,
                   posted=posted)
