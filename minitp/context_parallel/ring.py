"""Ring attention over the cp axis: each rank's queries meet every rank's keys and
values as they travel round the ring, one block at a time, merged by the online
softmax; the backward sends K, V and their gradients round again. Only the blocks the
causal mask leaves are computed (see `minitp.context_parallel`)."""

from __future__ import annotations

import math

import torch

from ..model.attention_core import keep_mask
from ..rules import cp_chunks
from ..runtime import comm, trace
from ..runtime.mesh import Axis

_TAG = 1 << 22  # ring messages' tags: far from the pipeline's (2·(g·m + i) + kind)
_K, _V, _K_BWD, _V_BWD, _DK, _DV = range(6)


def block_kind(q_chunk: int, k_chunk: int) -> str | None:
    """Which part of a (query chunk, key chunk) block the causal mask keeps."""
    if k_chunk < q_chunk:
        return "full"
    return "causal" if k_chunk == q_chunk else None


def _scores(q, k, keep):
    """The block's scores, -inf where the mask `keep` is False. keep: a bool tensor, or
    True (the causal triangle), False or None (every key kept)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, c, c)
    if keep is True:
        n = s.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
    return s if keep is None or keep is False else s.masked_fill(~keep, float("-inf"))


def widen(kv, heads: int):
    """Grouped-query K or V (B, nkv, c, hs) widened to the queries' heads: each K/V head
    repeated for its group. The ring carries the narrow one: its messages are nkv/nh
    the size."""
    return kv if kv.shape[1] == heads else kv.repeat_interleave(heads // kv.shape[1], dim=1)


def narrow(grad, kv_heads: int):
    """widen's backward: a group's gradients summed into its one K/V head."""
    if grad.shape[1] == kv_heads:
        return grad
    return grad.unflatten(1, (kv_heads, -1)).sum(2)


def block_forward(q, k, v, keep):
    """One block's partial output and its log-sum-exp: (B, nh, c, hs), (B, nh, c). keep:
    True for the causal triangle, False for every key, or a bool mask (`_scores`)."""
    s = _scores(q, k, keep)
    lse = torch.logsumexp(s, dim=-1)
    # packed documents: a query may see no key of this block (its document starts later):
    # its ℓ is −inf and its partial output 0, which the merge then weighs by e^−∞ = 0
    return torch.exp(s - _finite(lse).unsqueeze(-1)) @ v, lse


def _finite(lse):
    """ℓ, 0 where it is −inf (a row that saw no key): so that e^(s−ℓ) is 0 there, not NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def merge_partials(out1, lse1, out2, lse2):
    """The online-softmax merge of two partial attention results over disjoint keys."""
    lse = torch.logaddexp(lse1, lse2)
    ref = _finite(lse)  # both −inf: a row that has seen no key yet stays 0
    out = (torch.exp(lse1 - ref).unsqueeze(-1) * out1
           + torch.exp(lse2 - ref).unsqueeze(-1) * out2)
    return out, lse


def _pairs(rank: int, src: int, cp: int, positions, c: int, device):
    """(query half, key half, mask) of every block rank `rank` computes with the K/V of
    rank `src` (halves index the two chunks each rank holds; mask: None, all kept).
    `positions` (B, T), the whole sequence's, for packed documents, else None; c: a chunk's
    length."""
    mine, theirs = cp_chunks(rank, cp), cp_chunks(src, cp)
    for a in range(2):
        for b in range(2):
            kind = block_kind(mine[a], theirs[b])
            if kind is None:
                continue
            if positions is None:
                keep = kind == "causal"  # the triangle, or every key
            else:  # the causal mask within documents, from both chunks' global indices
                q_index, k_index = (torch.arange(n * c, (n + 1) * c, device=device)
                                    for n in (mine[a], theirs[b]))
                keep = keep_mask(positions, q_index, k_index)
            yield a, b, keep


def _post(tensors, kinds, step: int, cp: Axis):
    """Send `tensors` to the next rank of the ring and post their receives from the
    previous one; returns (sends, receives), each a list of `comm.Pending`."""
    # traced under the cp axis's name, so the ring's bytes are counted as cp's, not the pipeline's
    sends = [comm.isend(t, cp.next, _TAG + 8 * step + kind, via=cp.name)
             for t, kind in zip(tensors, kinds, strict=True)]
    recvs = [comm.irecv(torch.empty(t.shape, dtype=t.dtype, device=t.device), cp.prev,
                        _TAG + 8 * step + kind, via=cp.name)
             for t, kind in zip(tensors, kinds, strict=True)]
    return sends, recvs


def _finish(sends, recvs):
    out = [r.wait() for r in recvs]
    for s in sends:
        s.wait()
    return out


class _RingAttention(torch.autograd.Function):
    """fwd: causal attention of this rank's queries over every rank's K/V, passed
    around the cp ring and merged by log-sum-exp · bwd: the same ring, dK/dV
    travelling with their K/V back to their owners."""

    @staticmethod
    def forward(ctx, q, k, v, cp, positions):  # each (B, nh, 2c, hs): this rank's two chunks
        ctx.cp, ctx.label, ctx.positions = cp, trace.recorder().label, positions
        qs = q.chunk(2, dim=-2)
        out, lse = [None, None], [None, None]
        kv = (k.contiguous(), v.contiguous())
        for step in range(cp.size):
            pending = None
            if step < cp.size - 1:  # the next block travels while this one computes
                with trace.label("ring K/V"):
                    pending = _post(kv, (_K, _V), step, cp)
            src = (cp.rank - step) % cp.size
            ks, vs = (widen(t, q.shape[1]).chunk(2, dim=-2) for t in kv)
            for a, b, keep in _pairs(cp.rank, src, cp.size, positions, qs[0].shape[-2], q.device):
                o, ell = block_forward(qs[a], ks[b], vs[b], keep)
                if out[a] is None:
                    out[a], lse[a] = o, ell
                else:
                    out[a], lse[a] = merge_partials(out[a], lse[a], o, ell)
            if pending is not None:
                kv = tuple(_finish(*pending))
        out, lse = torch.cat(out, dim=-2), torch.cat(lse, dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        cp = ctx.cp
        with trace.relabel(ctx.label):
            return (*_ring_backward(q, k, v, out, lse, grad_out, cp, ctx.positions), None, None)


def _ring_backward(q, k, v, out, lse, grad_out, cp: Axis, positions):
    scale = 1.0 / math.sqrt(q.shape[-1])
    grad_out = grad_out.contiguous()
    delta = (grad_out * out).sum(-1)  # D = rowsum(dO ∘ O), (B, nh, 2c)
    qs, dos = q.chunk(2, dim=-2), grad_out.chunk(2, dim=-2)
    lses, deltas = lse.chunk(2, dim=-1), delta.chunk(2, dim=-1)
    dq = [torch.zeros_like(qs[0]), torch.zeros_like(qs[1])]
    kv = (k.contiguous(), v.contiguous())
    incoming = None  # the dK/dV accumulator on its way here
    for step in range(cp.size):
        pending = None
        if step < cp.size - 1:
            with trace.label("ring K/V"):
                pending = _post(kv, (_K_BWD, _V_BWD), step, cp)
        src = (cp.rank - step) % cp.size
        ks, vs = (widen(t, q.shape[1]).chunk(2, dim=-2) for t in kv)
        dk = [torch.zeros_like(kv[0].chunk(2, dim=-2)[0]) for _ in range(2)]  # K/V's heads
        dv = [torch.zeros_like(kv[1].chunk(2, dim=-2)[0]) for _ in range(2)]
        for a, b, keep in _pairs(cp.rank, src, cp.size, positions, qs[0].shape[-2], q.device):
            p = torch.exp(_scores(qs[a], ks[b], keep) - lses[a].unsqueeze(-1))  # (B, nh, c, c)
            dv[b] += narrow(p.transpose(-2, -1) @ dos[a], k.shape[1])
            ds = p * (dos[a] @ vs[b].transpose(-2, -1) - deltas[a].unsqueeze(-1))
            dq[a] += ds @ ks[b] * scale
            dk[b] += narrow(ds.transpose(-2, -1) @ qs[a] * scale, k.shape[1])
        dkv = [torch.cat(dk, dim=-2), torch.cat(dv, dim=-2)]
        if incoming is not None:  # what the ranks before added to this K/V's gradient
            before = _finish(*incoming)
            dkv = [dkv[0] + before[0], dkv[1] + before[1]]
        if cp.size > 1:  # on to the next rank; after the last step, home to the owner
            with trace.label("ring dK/dV"):
                incoming = _post(dkv, (_DK, _DV), step, cp)
        else:
            incoming = None
        if pending is not None:
            kv = tuple(_finish(*pending))
    dk_dv = _finish(*incoming) if incoming is not None else dkv
    return torch.cat(dq, dim=-2), dk_dv[0], dk_dv[1]


def ring_attention(q, k, v, cp: Axis, positions=None):
    """Causal attention of this cp rank's queries over the whole sequence's keys.

    q, k, v: (B, nh, 2c, hs), this rank's two chunks of the sequence
    (`split_sequence`), concatenated; k and v may have fewer heads, nkv dividing nh
    (grouped-query attention: each serves nh/nkv query heads, and travels the ring
    narrow). Returns (B, nh, 2c, hs): this rank's rows of softmax(QKᵀ/√d + causal
    mask)·V over the whole sequence. positions: packed documents', (B, T) the whole
    sequence's (every rank has them): each block masked within documents too."""
    if q.shape[-2] % 2:
        raise ValueError(f"ring attention needs this rank's two equal chunks, got "
                         f"{q.shape[-2]} positions")
    with trace.forward_phase():
        positions = None if positions is None else positions.to(q.device)
        return _RingAttention.apply(q, k, v, cp, positions)
