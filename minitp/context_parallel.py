"""Context parallelism: the sequence split across cp ranks everywhere, attention included.

Sequence parallelism splits the sequence everywhere except inside attention,
where every query needs every earlier key. Context parallelism (Liu et al.
2023, "Ring Attention"; Megatron-Core's ``context_parallel``) splits it there
too: each rank keeps its own queries, and the keys and values travel around
the cp ring, one block per step, while the rank computes with the block it
holds.

Load balancing. Under the causal mask a late query attends to more keys than an
early one. So the sequence is cut into 2·cp equal chunks and cp rank i holds
chunks i and 2cp−1−i (`minitp.config.cp_chunks`): one early, one late, the same
work on every rank. `split_sequence` takes a rank's two chunks of a (B, T, …)
tensor; `merge_sequence` is its inverse.

Ring attention, forward, on rank i: its queries Q = [Q_i; Q_2cp−1−i] against
the keys and values of every rank, one rank's K/V per step; step s holds the
K/V of rank i−s. For each pair of chunks (query chunk a, key chunk b):
b < a: every key is earlier, full attention; b = a: the causal triangle;
b > a: every key is later, skipped. Each block gives a partial output O_b and
its log-sum-exp ℓ_b = log Σ_j exp(s_j); two partials merge exactly as

    ℓ = log(e^ℓ₁ + e^ℓ₂),   O = e^(ℓ₁−ℓ) O₁ + e^(ℓ₂−ℓ) O₂

(the online softmax). The next step's K and V are posted (isend/irecv on the
cp ring, through `minitp.comm`, traced) before this step's blocks are computed,
so the transfer overlaps the compute. Kept for backward: Q, K, V, O and ℓ —
O(T/cp) per rank, no T×T probabilities.

Backward, by the same ring: K/V go around again; each rank recomputes each
block's probabilities P = exp(S − ℓ) from the saved ℓ, adds its dQ, and adds
its dK/dV to an accumulator that travels with the K/V it belongs to; after
cp steps the accumulator has visited every rank and one last hop brings it
home to its owner.

Messages per layer and rank (each one K or V tensor of B·h·(T/cp)·d values),
as the trace shows them: forward 2(cp−1) sends (K and V at cp−1 hops);
backward 2(cp−1) sends of K/V and 2·cp of dK/dV (cp hops, the last one home).

`apply_context_parallel` swaps the plain GPT's pieces for these (the model holds
no parallel code): the attention core for `RingAttention`, the position
embedding for `ContextParallelPositions` (each rank's global positions), the
loss for `ContextParallelLoss` (the mean over every token of the cp group).
The gradients of every parameter are then partial over cp — each rank saw its
tokens only — and are summed over dp×cp (`Mesh.dp_cp`) with the data-parallel
ones, as Megatron folds cp into its data-parallel gradient group.

Why one file: the split, the ring and the pieces that feed it are one rule seen
three times (which chunks a rank holds: its tokens, its positions, its blocks
of the causal mask); apart, each would restate it.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from . import comm, mappings, trace
from .config import IGNORE_INDEX, cp_chunks
from .mesh import Axis
from .module_plan import apply_plan
from .tensor_parallel import SequenceShardedPositions

SEQ_DIM = 1  # tokens and activations are (batch, seq, ...)
_TAG = 1 << 22  # ring messages' tags: far from the pipeline's (2·(g·m + i) + kind)
_K, _V, _K_BWD, _V_BWD, _DK, _DV = range(6)


# --------------------------------------------------------------------------- the split
def chunk_order(cp: int) -> list[int]:
    """The sequence's 2·cp chunks in the order the cp ranks hold them, rank 0 first:
    cp=2 -> [0, 3, 1, 2]."""
    return [c for r in range(cp) for c in cp_chunks(r, cp)]


def split_sequence(t: torch.Tensor, cp: Axis, dim: int = SEQ_DIM) -> torch.Tensor:
    """This cp rank's two chunks of `t` along `dim`, early one first (no communication)."""
    if cp.size == 1:
        return t
    if t.shape[dim] % (2 * cp.size):
        raise ValueError(f"a sequence of {t.shape[dim]} tokens cannot be cut into 2*cp="
                         f"{2 * cp.size} equal chunks for context parallelism")
    chunks = t.chunk(2 * cp.size, dim=dim)
    return torch.cat([chunks[c] for c in cp_chunks(cp.rank, cp.size)], dim=dim)


def merge_sequence(parts: list[torch.Tensor], dim: int = SEQ_DIM) -> torch.Tensor:
    """The inverse of `split_sequence`: every cp rank's part (rank 0's first) back
    into the whole sequence."""
    cp = len(parts)
    if cp == 1:
        return parts[0]
    halves = [h for part in parts for h in part.chunk(2, dim=dim)]  # in chunk_order(cp)
    whole = [None] * (2 * cp)
    for chunk, half in zip(chunk_order(cp), halves, strict=True):
        whole[chunk] = half
    return torch.cat(whole, dim=dim)


def gather_sequence(t: torch.Tensor, cp: Axis, dim: int = SEQ_DIM) -> torch.Tensor:
    """The whole sequence on every cp rank, from each rank's `split_sequence` part
    (an all-gather over cp, then `merge_sequence`)."""
    if cp.size == 1:
        return t
    gathered = comm.all_gather(t.movedim(dim, 0), cp).movedim(0, dim)
    return merge_sequence(list(gathered.chunk(cp.size, dim=dim)), dim)


def global_positions(local: int, cp: Axis, device=None) -> torch.Tensor:
    """The positions in the whole sequence of this cp rank's `local` tokens."""
    c = local // 2
    return torch.cat([torch.arange(k * c, (k + 1) * c, device=device)
                      for k in cp_chunks(cp.rank, cp.size)])


# --------------------------------------------------------------------------- blocks
def _block_kind(q_chunk: int, k_chunk: int) -> str | None:
    """Which part of a (query chunk, key chunk) block the causal mask keeps."""
    if k_chunk < q_chunk:
        return "full"
    return "causal" if k_chunk == q_chunk else None


def _scores(q, k, causal: bool):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, c, c)
    if causal:
        n = s.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _block_forward(q, k, v, causal: bool):
    """One block's partial output and its log-sum-exp: (B, nh, c, hs), (B, nh, c)."""
    s = _scores(q, k, causal)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge_partials(out1, lse1, out2, lse2):
    """The online-softmax merge of two partial attention results over disjoint keys."""
    lse = torch.logaddexp(lse1, lse2)
    out = torch.exp(lse1 - lse).unsqueeze(-1) * out1 + torch.exp(lse2 - lse).unsqueeze(-1) * out2
    return out, lse


def _pairs(rank: int, src: int, cp: int):
    """(query half, key half, causal) of every block rank `rank` computes with the
    K/V of rank `src` (halves index the two chunks each rank holds)."""
    mine, theirs = cp_chunks(rank, cp), cp_chunks(src, cp)
    for a in range(2):
        for b in range(2):
            kind = _block_kind(mine[a], theirs[b])
            if kind is not None:
                yield a, b, kind == "causal"


# --------------------------------------------------------------------------- the ring
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
    def forward(ctx, q, k, v, cp):  # each (B, nh, 2c, hs): this rank's two chunks
        ctx.cp, ctx.label = cp, trace.recorder().label
        qs = q.chunk(2, dim=-2)
        out, lse = [None, None], [None, None]
        kv = (k.contiguous(), v.contiguous())
        for step in range(cp.size):
            pending = None
            if step < cp.size - 1:  # the next block travels while this one computes
                with trace.label("ring K/V"):
                    pending = _post(kv, (_K, _V), step, cp)
            src = (cp.rank - step) % cp.size
            ks, vs = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
            for a, b, causal in _pairs(cp.rank, src, cp.size):
                o, ell = _block_forward(qs[a], ks[b], vs[b], causal)
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
            return (*_ring_backward(q, k, v, out, lse, grad_out, cp), None)


def _ring_backward(q, k, v, out, lse, grad_out, cp: Axis):
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
        ks, vs = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
        dk = [torch.zeros_like(ks[0]), torch.zeros_like(ks[1])]
        dv = [torch.zeros_like(vs[0]), torch.zeros_like(vs[1])]
        for a, b, causal in _pairs(cp.rank, src, cp.size):
            p = torch.exp(_scores(qs[a], ks[b], causal) - lses[a].unsqueeze(-1))  # (B, nh, c, c)
            dv[b] += p.transpose(-2, -1) @ dos[a]
            ds = p * (dos[a] @ vs[b].transpose(-2, -1) - deltas[a].unsqueeze(-1))
            dq[a] += ds @ ks[b] * scale
            dk[b] += ds.transpose(-2, -1) @ qs[a] * scale
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


def ring_attention(q, k, v, cp: Axis):
    """Causal attention of this cp rank's queries over the whole sequence's keys.

    q, k, v: (B, nh, 2c, hs), this rank's two chunks of the sequence
    (`split_sequence`), concatenated. Returns (B, nh, 2c, hs): this rank's rows of
    softmax(QKᵀ/√d + causal mask)·V over the whole sequence."""
    if q.shape[-2] % 2:
        raise ValueError(f"ring attention needs this rank's two equal chunks, got "
                         f"{q.shape[-2]} positions")
    with trace.forward_phase():
        return _RingAttention.apply(q, k, v, cp)


# --------------------------------------------------------------------------- the pieces
class RingAttention(nn.Module):
    """The attention core of a context-parallel rank (replaces `AttentionCore`)."""

    def __init__(self, cp: Axis, dropout: float = 0.0):
        super().__init__()
        if dropout > 0:
            raise ValueError(f"attention dropout {dropout} with context parallelism: the ring "
                             "never forms whole probability rows to drop, so it is refused")
        self.cp = cp

    def forward(self, q, k, v):  # each (B, nh, 2c, hs)
        return ring_attention(q, k, v, self.cp)

    def extra_repr(self) -> str:
        return f"ring over {self.cp.name} ranks {list(self.cp.ranks)}"


class ContextParallelPositions(nn.Module):
    """The position embedding of a context-parallel rank: the whole table
    (replicated), the rows of this rank's global positions — its two chunks and,
    under sequence parallelism, this tp rank's slice of them."""

    def __init__(self, weight: nn.Parameter, cp: Axis, sequence_axis: Axis | None = None):
        super().__init__()
        self.weight, self.cp, self.sequence_axis = weight, cp, sequence_axis

    def forward(self, x):  # (B, T/cp, C), or (B, T/(cp·t), C) under sequence parallelism
        local, start, per_cp = x.shape[1], 0, x.shape[1]
        if self.sequence_axis is not None:
            per_cp = local * self.sequence_axis.size
            start = self.sequence_axis.rank * local
        if per_cp * self.cp.size > self.weight.shape[0]:
            raise ValueError(f"a sequence of {per_cp * self.cp.size} tokens is longer than "
                             f"seq_len={self.weight.shape[0]}")
        positions = global_positions(per_cp, self.cp, x.device)[start:start + local]
        return x + self.weight[positions]


class ContextParallelLoss(nn.Module):
    """The mean loss over every (non-ignored) target of the cp group: this rank's
    sum and count, all-reduced over cp (fwd: all-reduce · bwd: identity, Megatron's
    g: each rank's backward then carries its own tokens' share)."""

    def __init__(self, inner: nn.Module, cp: Axis):
        super().__init__()
        self.inner, self.cp = inner, cp

    def forward(self, logits, targets):
        count = (targets != IGNORE_INDEX).sum()
        if int(count):
            local = self.inner(logits, targets) * count
        else:  # no targets here: a zero sum, still part of the graph
            local = logits.sum() * 0.0
        both = torch.stack([local, count.to(local.dtype)])
        with trace.label("cp loss"):
            total = mappings.reduce_from_parallel(both, self.cp)
        return total[0] / total[1]


def _ring(m, cp, model):
    return RingAttention(cp, m.dropout.p)


def _positions(m, cp, model):
    axis = m.axis if isinstance(m, SequenceShardedPositions) else None
    return ContextParallelPositions(m.weight, cp, axis)


def _loss(m, cp, model):
    return ContextParallelLoss(m, cp)


# What each piece of the (tensor-parallel) GPT becomes on a context-parallel rank.
CONTEXT_PARALLEL_PLAN = [
    ("blocks.*.attn.core", _ring),
    ("wpe", _positions),
    ("loss", _loss),
]


def apply_context_parallel(model: nn.Module, cp: Axis) -> None:
    """Make `model` (a GPT, after tensor parallelism; changed in place) run on this cp
    rank's part of the sequence. Nothing to do on an axis of one rank."""
    if cp.size > 1:
        apply_plan(model, CONTEXT_PARALLEL_PLAN, (cp, model))
