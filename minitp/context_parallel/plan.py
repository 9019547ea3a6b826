"""Context parallelism: the sequence split across cp ranks everywhere, attention included.

Sequence parallelism splits the sequence everywhere except inside attention,
where every query needs every earlier key. Context parallelism (Liu et al.
2023, "Ring Attention"; Megatron-Core's ``context_parallel``) splits it there
too: each rank keeps its own queries, and the keys and values travel around
the cp ring, one block per step, while the rank computes with the block it
holds.

Load balancing. Under the causal mask a late query attends to more keys than an
early one. So the sequence is cut into 2·cp equal chunks and cp rank i holds
chunks i and 2cp−1−i (`minitp.rules.cp_chunks`): one early, one late, the same
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
cp ring, through `minitp.runtime.comm`, traced) before this step's blocks are computed,
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
no parallel code): the attention core for `RingAttention` (or, by ``cp_comm``,
`AllGatherAttention`, its K/V kept or gathered again, or `UlyssesAttention`:
`minitp.rules.cp_comm`), the position embedding for `ContextParallelPositions` (each
rank's global positions), the loss for `ContextParallelLoss` (the mean over every token
of the cp group). The gradients of every parameter are then partial over cp — each rank saw its
tokens only — and are summed over dp×cp (`Mesh.dp_cp`) with the data-parallel
ones, as Megatron folds cp into its data-parallel gradient group.

Where each part lives: `minitp.context_parallel.split` (the split and the positions),
`minitp.context_parallel.ring` (the ring); their names are this module's too. Here: the
pieces `apply_context_parallel` puts in the model.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..model.llama_layers import Rotary
from ..rules import IGNORE_INDEX, ulysses_size
from ..runtime import trace
from ..runtime.mesh import Axis
from ..sharding.plan import apply_plan
from ..tensor_parallel import mappings
from ..tensor_parallel.plan import SequenceShardedPositions
from .allgather import AllGatherAttention
from .latent import latent_plan
from .ring import ring_attention
from .split import global_positions, split_sequence
from .ulysses import UlyssesAttention, hybrid_axes


class RingAttention(nn.Module):
    """The attention core of a context-parallel rank (replaces `AttentionCore`)."""

    def __init__(self, cp: Axis, dropout: float = 0.0):
        super().__init__()
        if dropout > 0:
            raise ValueError(f"attention dropout {dropout} with context parallelism: the ring "
                             "never forms whole probability rows to drop, so it is refused")
        self.cp = cp

    def forward(self, q, k, v, positions=None):  # each (B, nh, 2c, hs)
        return ring_attention(q, k, v, self.cp, positions)

    def extra_repr(self) -> str:
        return f"ring over {self.cp.name} ranks {list(self.cp.ranks)}"


class ContextParallelPositions(nn.Module):
    """The position embedding of a context-parallel rank: the whole table
    (replicated), the rows of this rank's global positions — its two chunks and,
    under sequence parallelism, this tp rank's slice of them; of a packed batch's
    `positions` (B, T), the whole sequence's, the same slice of them."""

    def __init__(self, weight: nn.Parameter, cp: Axis, sequence_axis: Axis | None = None):
        super().__init__()
        self.weight, self.cp, self.sequence_axis = weight, cp, sequence_axis

    def forward(self, x, positions=None):  # (B, T/cp, C), or (B, T/(cp·t), C) under SP
        local, start, per_cp = x.shape[1], 0, x.shape[1]
        if self.sequence_axis is not None:
            per_cp = local * self.sequence_axis.size
            start = self.sequence_axis.rank * local
        if per_cp * self.cp.size > self.weight.shape[0]:
            raise ValueError(f"a sequence of {per_cp * self.cp.size} tokens is longer than "
                             f"seq_len={self.weight.shape[0]}")
        if positions is not None:  # packed: this rank's chunks of the batch's positions
            mine = split_sequence(positions.to(x.device), self.cp, dim=1)[:, start:start + local]
            return x + self.weight[mine]
        return x + self.weight[global_positions(per_cp, self.cp, x.device)[start:start + local]]


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


class ContextParallelRotary(Rotary):
    """The rotary embedding of a context-parallel rank: its tokens turned by their
    *global* positions (the two chunks of the load-balanced split), where the plain
    `Rotary` counts from 0 — the trap: at local positions every rank would rotate its
    tokens as if they began the sequence. Attention sees this cp rank's whole part
    (sequence parallelism gathers it first), so its positions are the cp rank's."""

    def __init__(self, rotary: Rotary, cp: Axis):
        super().__init__(rotary.head_dim, rotary.seq_len, rotary.theta)
        self.cp = cp

    def positions(self, length: int, device) -> torch.Tensor:
        return global_positions(length, self.cp, device)

    def local(self, positions: torch.Tensor) -> torch.Tensor:  # packed: this rank's chunks
        return split_sequence(positions, self.cp, dim=1)


def _rotary(m, cp, model):
    return ContextParallelRotary(m, cp)


# What each piece of the (tensor-parallel) GPT becomes on a context-parallel rank.
CONTEXT_PARALLEL_PLAN = [
    ("blocks.*.attn.core", _ring),
    ("wpe", _positions),
    ("loss", _loss),
]


def _core_maker(cp_comm: str, axes):
    """The plan's maker of the attention core for `cp_comm` (`minitp.rules.CP_COMMS`)."""
    if cp_comm == "ring":
        return _ring
    if cp_comm in ("allgather", "allgather-regather"):
        regather = cp_comm == "allgather-regather"
        return lambda m, cp, model: AllGatherAttention(cp, m.attention, regather)
    group, ring = axes  # a2a: (cp, one rank); a2a+ring: `hybrid_axes`
    return lambda m, cp, model: UlyssesAttention(group, m, ring)


def apply_context_parallel(model: nn.Module, cp: Axis, cp_comm: str = "ring",
                           axes: tuple[Axis, Axis] | None = None) -> None:
    """Make `model` (a GPT, after tensor parallelism; changed in place) run on this cp
    rank's part of the sequence, its attention by `cp_comm` ("ring", "allgather",
    "allgather-regather", "a2a", "a2a+ring"; the last two need `axes`, the all-to-all group
    and the ring: `attention_axes`). Nothing to do on an axis of one rank."""
    if cp.size > 1:
        rotary = model.cfg.positions == "rope"  # positions inside attention, not in wpe
        plan = [(pattern, _core_maker(cp_comm, axes) if pattern.endswith("core") else make)
                for pattern, make in CONTEXT_PARALLEL_PLAN if pattern != "wpe" or not rotary]
        plan += [("blocks.*.attn.rope", _rotary)] if rotary else []
        if model.cfg.kv_lora_rank:  # latent attention: its latent gathered (`.latent`)
            plan = [entry for entry in plan if not entry[0].endswith("core")] + latent_plan(cp)
        apply_plan(model, plan, (cp, model))


def attention_axes(mesh, cp_comm: str, cp_a2a_size: int | None = None):
    """The (all-to-all group, ring) the attention of `cp_comm` runs over, or None for the
    ring and the all-gather (they use ``mesh.cp``). "a2a+ring" creates process groups:
    every rank calls this, in the same order."""
    if mesh.cp.size == 1 or cp_comm not in ("a2a", "a2a+ring"):
        return None
    return hybrid_axes(mesh, ulysses_size(cp_comm, mesh.cp.size, cp_a2a_size))
