"""Overlapped tensor-parallel communication: the collective matmul (async TP).

With sequence parallelism every column-parallel GEMM waits for an all-gather of
its input (the sequence shards), and every row-parallel GEMM's output waits for
a reduce-scatter. Both collectives are rings of t-1 steps, and each step moves
one sequence chunk. So the GEMM can be cut along the sequence into t chunks and
each chunk multiplied while the ring moves the next one (Wang et al. 2023,
"Overlap communication with dependent computation"; PyTorch's async TP):

  all-gather → GEMM (column-parallel forward, row-parallel backward)::

      step k: send the chunk I hold to the next rank, receive one from the
              previous rank, and meanwhile multiply the chunk I hold.

  GEMM → reduce-scatter (row-parallel forward, column-parallel backward)::

      step k: send my running sum for one chunk to the next rank, and meanwhile
              multiply my term of the chunk whose sum I receive; add it.

After t steps every rank has multiplied every chunk (the gather) or holds the
full sum of its own chunk (the reduce-scatter): the same numbers as the
unchunked layer, summed in another order (equal in float64 to rounding).
Messages are `comm.isend` / `comm.irecv` (traced, posted before the chunk's GEMM
and waited after it); each chunk's GEMM is a `trace.region` named
"<layer>.gemm<c>", so a trace shows what ran under what.

Memory: the column-parallel layer keeps the gathered input for its weight
gradient, as the plain layer's F.linear does — no more, no less.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..rules import SEQ_DIM
from ..runtime import comm, trace
from ..runtime.mesh import Axis
from .layers import ColumnParallelLinear, RowParallelLinear

RING_TAG = 13  # p2p messages of the ring; its peers are tp neighbours, never pp ones


def _neighbours(axis: Axis) -> tuple[int, int]:
    """Global ranks of the next and the previous rank on the ring of `axis`."""
    r, t = axis.rank, axis.size
    return axis.ranks[(r + 1) % t], axis.ranks[(r - 1) % t]


def _chunk(x: torch.Tensor, c: int, t: int) -> torch.Tensor:
    return x.narrow(SEQ_DIM, c * (x.shape[SEQ_DIM] // t), x.shape[SEQ_DIM] // t)


def _gemm(name: str, c: int, fn, arg):
    """One chunk's GEMM, recorded as a compute region under the layer's label."""
    with trace.region(f"{trace.recorder().label}.{name}{c}", trace.current_phase()):
        return fn(arg)


def gather_then_apply(x: torch.Tensor, fn, axis: Axis):
    """(fn of the all-gathered x, the all-gathered x), `fn` applied chunk by chunk
    while the chunks travel the ring. `x`: this rank's (B, T/t, ·) shard; `fn`
    maps a (B, T/t, ·) chunk to its output (B, T/t, ·')."""
    t, r = axis.size, axis.rank
    nxt, prv = _neighbours(axis)
    held, outs = [None] * t, [None] * t
    cur = x.detach().contiguous()
    for k in range(t):
        owner = (r - k) % t  # the rank whose shard I hold at step k
        held[owner] = cur
        if k < t - 1:  # pass it on while multiplying it
            buf = torch.empty_like(cur)
            pending = [comm.isend(cur, nxt, tag=RING_TAG, via=axis.name),
                       comm.irecv(buf, prv, tag=RING_TAG, via=axis.name)]
        outs[owner] = _gemm("gemm", owner, fn, cur)
        if k < t - 1:
            for p in pending:
                p.wait()
            cur = buf
    return torch.cat(outs, dim=SEQ_DIM), torch.cat(held, dim=SEQ_DIM)


def apply_then_reduce_scatter(fn, axis: Axis) -> torch.Tensor:
    """This rank's chunk of Σ_ranks fn(·), chunk by chunk along a ring: `fn(c)` is
    this rank's term for sequence chunk c (B, T/t, ·). The running sum of chunk c
    starts at rank c+1 and ends, complete, at rank c."""
    t, r = axis.size, axis.rank
    nxt, prv = _neighbours(axis)
    acc = _gemm("gemm", (r - 1) % t, fn, (r - 1) % t)
    for k in range(1, t):
        c = (r - k - 1) % t  # the chunk whose running sum arrives now
        buf = torch.empty_like(acc)
        pending = [comm.isend(acc, nxt, tag=RING_TAG, via=axis.name),
                   comm.irecv(buf, prv, tag=RING_TAG, via=axis.name)]
        part = _gemm("gemm", c, fn, c)  # my term, while the sum so far travels
        for p in pending:
            p.wait()
        acc = buf + part
    return acc


class _GatherLinear(torch.autograd.Function):
    """x_shard ↦ all_gather(x) @ Wᵀ, chunked · bwd: (gy @ W) reduce-scattered, chunked."""

    @staticmethod
    def forward(ctx, x, weight, axis):
        ctx.axis, ctx.label = axis, trace.recorder().label
        y, full = gather_then_apply(x, lambda chunk: F.linear(chunk, weight), axis)
        ctx.save_for_backward(full, weight)
        return y

    @staticmethod
    def backward(ctx, gy):
        full, weight = ctx.saved_tensors
        t = ctx.axis.size
        with trace.relabel(ctx.label):
            gx = apply_then_reduce_scatter(lambda c: _chunk(gy, c, t) @ weight, ctx.axis)
        gw = gy.reshape(-1, gy.shape[-1]).T @ full.reshape(-1, full.shape[-1])
        return gx, gw, None


class _LinearReduceScatter(torch.autograd.Function):
    """x ↦ reduce_scatter(x @ Wᵀ), chunked · bwd: all_gather(gy) @ W, chunked."""

    @staticmethod
    def forward(ctx, x, weight, axis):
        ctx.axis, ctx.label = axis, trace.recorder().label
        t = axis.size
        y = apply_then_reduce_scatter(lambda c: F.linear(_chunk(x, c, t), weight), axis)
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        with trace.relabel(ctx.label):
            gx, gy_full = gather_then_apply(gy, lambda chunk: chunk @ weight, ctx.axis)
        gw = gy_full.reshape(-1, gy_full.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        return gx, gw, None


def _require_sequence_parallel(kw) -> None:
    if not kw.setdefault("sequence_parallel", True):
        raise ValueError("the overlapped layers chunk the sequence: they need "
                         "sequence_parallel=True")


class OverlappedColumnParallelLinear(ColumnParallelLinear):
    """`ColumnParallelLinear` under sequence parallelism whose input all-gather is
    overlapped, chunk by chunk, with its GEMM (and, backward, the reduce-scatter
    of the input gradient with the GEMM that makes it). Same weights, same tags."""

    def __init__(self, d_in: int, d_out: int, axis: Axis, **kw):
        _require_sequence_parallel(kw)
        if kw.get("gather_output"):
            raise ValueError("OverlappedColumnParallelLinear does not gather its output")
        super().__init__(d_in, d_out, axis, **kw)

    def forward(self, x):  # (B, T/t, C) -> (B, T, d_out/t)
        with trace.forward_phase():
            y = _GatherLinear.apply(x, self.weight, self.axis)
        return y + self.bias if self.bias is not None else y


class OverlappedRowParallelLinear(RowParallelLinear):
    """`RowParallelLinear` under sequence parallelism whose output reduce-scatter is
    overlapped, chunk by chunk, with its GEMM (and, backward, the all-gather of the
    output gradient with the GEMM that uses it). Same weights, same tags."""

    def __init__(self, d_in: int, d_out: int, axis: Axis, **kw):
        _require_sequence_parallel(kw)
        super().__init__(d_in, d_out, axis, **kw)

    def forward(self, x):  # (B, T, d_in/t) -> (B, T/t, d_out)
        if x.shape[SEQ_DIM] % self.axis.size:
            raise ValueError(f"a sequence of {x.shape[SEQ_DIM]} tokens does not split into "
                             f"{self.axis.size} equal chunks")
        with trace.forward_phase():
            y = _LinearReduceScatter.apply(x, self.weight, self.axis)
        return y + self.bias if self.bias is not None else y
