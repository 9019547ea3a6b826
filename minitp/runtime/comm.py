"""Traced, device-agnostic collectives and point-to-point messages.

This module and `minitp.runtime.comm_pending` are the only ones that call
``torch.distributed`` communication. Every function takes the `Axis` to talk on
(never a global group), returns its result as a new tensor allocated like its input
(CPU or GPU alike), and leaves an `Event` in this rank's trace.

Rules learned on gloo (CPU), torch 2.4 onwards:
  * use the tensor variants (``all_gather_single``, ``reduce_scatter_single``: torch 2.13's
    names; the older ``*_into_tensor``/``*_tensor`` warn FutureWarning on every rank);
    where the installed torch lacks one for this backend we fall back to a
    collective that is correct and say so in the event label;
  * never ``ReduceOp.AVG`` (gloo's reduce-scatter silently returns the SUM on
    torch <= 2.8): sum, then divide;
  * gathers need equal shapes on every rank: pad first.

Bytes: each Event carries ``model_bytes`` (the ring formula) and ``sent_bytes``,
what this process measurably wrote while the op ran (`minitp.runtime.io_counters`;
``None`` where that cannot be told apart or counted). An op on an axis of one
rank moves nothing and is not traced: it returns its (copied) input.

Checks: before a collective runs, the ranks of its axis compare their calls (op, shape,
dtype, src/dim/reduce op, an all-to-all's splits) and, where they do not fit, every rank
raises the same `CollectiveMismatch` naming each rank's call, where gloo would return a
half-overwritten broadcast or uninitialised rows. That exchange leaves no Event and is
not in ``sent_bytes``; ``with checks(False):`` turns it off to time the ops alone
(`minitp.runtime._collective_checks`). Point-to-point messages are not checked.

Non-blocking forms (``*_start``, ``isend``/``irecv``) return a `Pending`: the op
runs in gloo's (or NCCL's) own thread while this one computes, and its Event
spans from posting to the completed wait.

Where each part lives: `minitp.runtime._traced_op` (the window every op is recorded in, and
its bytes), `minitp.runtime._collective_checks` (the ranks' calls compared first),
`minitp.runtime._comm_buffers` (gloo's rules for gathers and scatters: tensor
variants, equal shapes), `minitp.runtime.comm_pending` (`Pending` and the non-blocking forms,
re-exported here); this module holds the blocking ops.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import _device, trace
from ._collective_checks import agree, checks, enabled  # noqa: F401  (the switch: comm's too)
from ._comm_buffers import gather_buffers, gathered_along, scatter_buffers
from ._traced_op import TracedOp, record_p2p
from .comm_pending import (  # noqa: F401  (the non-blocking forms are comm's names too)
    Pending,
    all_gather_start,
    all_reduce_start,
    irecv,
    isend,
    reduce_scatter_start,
)
from .errors import CollectiveMismatch  # noqa: F401  (what a check raises, as comm's name)
from .mesh import Axis

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}
def all_reduce(x: torch.Tensor, axis: Axis, op: str = "sum") -> torch.Tensor:
    """Every rank of `axis` gets the elementwise reduction (sum by default) of all ranks' `x`."""
    if op not in _REDUCE_OPS:
        hint = " (use op='sum' and divide: gloo mishandles AVG)" if op in ("avg", "mean") else ""
        raise ValueError(f"all_reduce op must be one of {sorted(_REDUCE_OPS)}, got {op!r}{hint}")
    out = x.detach().clone()
    if axis.size == 1:
        return out
    start = agree("all_reduce", axis, out, op)
    with TracedOp("all_reduce", axis, out, out.numel() * out.element_size(), start=start):
        dist.all_reduce(out, op=_REDUCE_OPS[op], group=axis.group)
    return out


def all_gather(x: torch.Tensor, axis: Axis, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim` (equal shapes on all ranks), on every rank."""
    local, out, dim = gather_buffers(x, axis, dim)
    if out is None:
        return local.clone()
    start = agree("all_gather", axis, x, dim)
    with TracedOp("all_gather", axis, x, out.numel() * out.element_size(), start=start):
        dist.all_gather_single(out, local, group=axis.group)
    return gathered_along(out, local, axis.size, dim)
def reduce_scatter(x: torch.Tensor, axis: Axis, dim: int = 0) -> torch.Tensor:
    """Sum `x` over the ranks of `axis`; rank i keeps the i-th of n equal chunks along `dim`."""
    flat, out = scatter_buffers(x, axis, dim)
    if out is None:
        return x.detach().clone()
    start = agree("reduce_scatter", axis, x, dim % x.dim())
    with TracedOp("reduce_scatter", axis, x, flat.numel() * flat.element_size(), start=start):
        dist.reduce_scatter_single(out, flat, op=dist.ReduceOp.SUM, group=axis.group)
    return out
def exchange_counts(counts, axis: Axis) -> list[int]:
    """Rank r tells the k-th rank of `axis` ``counts[k]`` (how many rows it will send it)
    and learns what each rank will send it: the all-to-all of n integers that precedes
    an all-to-all of uneven size (each receiver must size its buffer)."""
    counts = _splits(counts, axis, "counts")
    if axis.size == 1:
        return counts
    send = torch.tensor(counts, dtype=torch.int64, device=_device.device())  # NCCL: on the GPU
    out = torch.empty_like(send)
    start = agree("all_to_all", axis, send, send=[1] * axis.size, recv=[1] * axis.size)
    with TracedOp("all_to_all", axis, send, send.numel() * 8, model_bytes=(axis.size - 1) * 8,
                  start=start):
        dist.all_to_all_single(out, send, group=axis.group)
    return out.tolist()


def all_to_all(x: torch.Tensor, axis: Axis, send_splits, recv_splits=None) -> torch.Tensor:
    """Rank r sends the k-th run of `send_splits[k]` rows of `x` (dim 0, in order) to the
    k-th rank of `axis`, and returns the rows every rank sent it, in rank order:
    `recv_splits[k]` from the k-th. Without `recv_splits`, `exchange_counts` finds them
    first. The model's bytes are what this rank sends to the others (its own run stays)."""
    send_splits = _splits(send_splits, axis, "send_splits")
    if sum(send_splits) != x.shape[0]:
        raise ValueError(f"all_to_all: send_splits {send_splits} add up to {sum(send_splits)} "
                         f"rows, but x has {x.shape[0]}")
    if recv_splits is None:
        recv_splits = exchange_counts(send_splits, axis)
    recv_splits = _splits(recv_splits, axis, "recv_splits")
    if axis.size == 1:
        return x.detach().clone()
    payload = x.detach().contiguous()
    row = math.prod(payload.shape[1:]) * payload.element_size()  # bytes of one row
    out = payload.new_empty((sum(recv_splits), *payload.shape[1:]))
    others = sum(s for k, s in enumerate(send_splits) if k != axis.rank)
    start = agree("all_to_all", axis, payload, send=send_splits, recv=recv_splits)
    with TracedOp("all_to_all", axis, payload, payload.numel() * payload.element_size(),
                  model_bytes=others * row, start=start):
        dist.all_to_all_single(out, payload, output_split_sizes=recv_splits,
                               input_split_sizes=send_splits, group=axis.group)
    return out


def _splits(splits, axis: Axis, name: str) -> list[int]:
    splits = [int(s) for s in splits]
    if len(splits) != axis.size or any(s < 0 for s in splits):
        raise ValueError(f"all_to_all: {name} must be {axis.size} counts >= 0 (one per rank "
                         f"of axis {axis.name}), got {splits}")
    return splits


def broadcast(x: torch.Tensor, axis: Axis, src: int = 0) -> torch.Tensor:
    """Every rank of `axis` gets the `x` of the rank at index `src` *within the axis*."""
    if not 0 <= src < axis.size:
        raise ValueError(f"broadcast src must be an index in 0..{axis.size - 1}, got {src}")
    out = x.detach().clone()
    if axis.size == 1:
        return out
    start = agree("broadcast", axis, out, src)
    with TracedOp("broadcast", axis, out, out.numel() * out.element_size(), src=src,
                  start=start):
        dist.broadcast(out, src=axis.ranks[src], group=axis.group)
    return out


def send(x: torch.Tensor, dst: int) -> None:
    """Send `x` to global rank `dst` (blocks until the message is handed over)."""
    payload = x.detach().contiguous()
    with TracedOp("send", None, payload, payload.numel() * payload.element_size(), peer=dst):
        dist.send(payload, dst)


def recv(x: torch.Tensor, src: int) -> torch.Tensor:
    """Receive into `x` (its shape and dtype say what to expect) from global rank `src`."""
    if not x.is_contiguous():
        raise ValueError("recv needs a contiguous buffer")
    with TracedOp("recv", None, x, x.numel() * x.element_size(), peer=src):
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
    with TracedOp("send", None, payload, payload.numel() * payload.element_size(), peer=dst):
        ops = [dist.P2POp(dist.isend, payload, dst), dist.P2POp(dist.irecv, out, src)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    record_p2p("recv", out, src, start)
    return out


def barrier(axis: Axis) -> None:
    """Wait until every rank of `axis` arrives (an empty all-reduce, traced)."""
    if axis.size == 1:
        return
    token = torch.zeros(1, device=_device.device())  # NCCL needs it on this rank's GPU
    start = agree("barrier", axis, token)
    with TracedOp("barrier", axis, token, 0, start=start):
        dist.all_reduce(token, group=axis.group)
