"""Ulysses context parallelism (Jacobs et al. 2023, DeepSpeed Ulysses, arXiv:2309.14509;
DeepSpeed's ``deepspeed/runtime/sequence_parallel/ulysses_sp.py``; Megatron-LM's
``--cp-comm-type a2a``) and its hybrid with the ring (Fang and Zhao 2024, USP,
arXiv:2405.07719; Megatron-LM's ``a2a+p2p``).

Outside attention every rank holds its s/cp positions (the load-balanced split) of every
head. An all-to-all over the U ranks of a Ulysses group trades that for all the group's
positions of 1/U of the heads: rank j sends its positions of head group k to rank k and
receives rank k's positions of head group j. Attention then runs whole on those heads,
and one all-to-all trades back. Backward mirrors it: the all-to-all's adjoint is the
reverse all-to-all. Q, K and V go in (three all-to-alls), O comes out (one); backward,
dO in and dQ, dK, dV out.

The positions arrive in rank order, each rank's two chunks (g·U+u, 2cp−1−g·U−u) for
u = 0..U−1: put back as [the U early chunks in order; the U late ones in order] they are
the two big chunks g and 2R−1−g of the sequence cut into 2R, R = cp/U — the load-balanced
split of a ring of R ranks. With U = cp (R = 1) that is the global order, and the layer's
own causal core runs; with R > 1 the ring runs over the R groups (`ring_attention`). So a
packed batch's positions, the whole sequence's, mask either as they stand.

Memory: the core keeps what one device's would for 1/U of the heads — with the
written-out core, their s×s probabilities too (the ring never forms them).

Grouped-query K/V (`minitp.rules.ulysses_kv_layout`): U dividing a tp rank's K/V heads
splits them like the queries; U a multiple of them widens each K/V head to U/n_kv copies
first (its gradient summed back), one per rank whose query heads read it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ..runtime import comm, trace
from ..runtime.mesh import Axis, layout
from .ring import ring_attention, widen


def all_to_all(x: torch.Tensor, axis: Axis, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """`x` cut into axis.size parts along `scatter_dim`, the k-th sent to rank k; what
    every rank sent here, concatenated along `gather_dim` in rank order (no autograd)."""
    n = axis.size
    parts = torch.stack(x.chunk(n, dim=scatter_dim))  # (n, …): row k goes to rank k
    out = comm.all_to_all(parts, axis, [1] * n, [1] * n)
    return torch.cat(out.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """fwd: scatter `scatter_dim`, gather `gather_dim` · bwd: the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x, axis, scatter_dim, gather_dim):
        ctx.axis, ctx.dims, ctx.label = axis, (scatter_dim, gather_dim), trace.recorder().label
        return all_to_all(x, axis, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        with trace.relabel(ctx.label):  # backward runs after the forward's label ended
            return all_to_all(grad, ctx.axis, ctx.dims[1], ctx.dims[0]), None, None, None


def heads_to_sequence(x, axis: Axis):
    """(B, h, L, hs) every head at this rank's L positions -> (B, h/U, U·L, hs)."""
    with trace.forward_phase():
        return _AllToAll.apply(x, axis, 1, 2)


def sequence_to_heads(x, axis: Axis):
    """(B, h/U, U·L, hs) -> (B, h, L, hs): `heads_to_sequence`'s inverse."""
    with trace.forward_phase():
        return _AllToAll.apply(x, axis, 2, 1)


def to_ring_order(t, u: int):
    """The U ranks' (early, late) chunk pairs, in rank order, as [early ones; late ones
    reversed]: two contiguous runs of the sequence (see the module)."""
    pieces = t.chunk(2 * u, dim=2)
    return torch.cat([pieces[2 * i] for i in range(u)]
                     + [pieces[2 * i + 1] for i in reversed(range(u))], dim=2)


def from_ring_order(t, u: int):
    """`to_ring_order`'s inverse."""
    pieces = t.chunk(2 * u, dim=2)
    return torch.cat([p for i in range(u) for p in (pieces[i], pieces[2 * u - 1 - i])], dim=2)


class UlyssesAttention(nn.Module):
    """The attention core of a context-parallel rank by all-to-all (replaces
    `AttentionCore`): over `group` (U ranks), then `inner` — the layer's own core when the
    group is the whole cp axis, else ring attention over `ring` (the hybrid)."""

    def __init__(self, group: Axis, inner: nn.Module, ring: Axis | None = None):
        super().__init__()
        self.group, self.inner, self.ring = group, inner, ring

    def forward(self, q, k, v, positions=None):  # (B, nh, 2c, hs); k, v (B, nkv, 2c, hs)
        u = self.group.size
        if k.shape[1] % u:  # fewer K/V heads than ranks: one (copied) K/V head per rank
            k, v = widen(k, u), widen(v, u)
        with trace.label("a2a Q/K/V"):
            q, k, v = (to_ring_order(heads_to_sequence(t, self.group), u) for t in (q, k, v))
        if self.ring is not None and self.ring.size > 1:
            y = ring_attention(q, k, v, self.ring, positions)  # whole positions: the ring's chunks
        else:  # the whole sequence, global order: the plain causal core
            y = self.inner(q, k, v, **({} if positions is None else {"positions": positions}))
        with trace.label("a2a O"):
            return sequence_to_heads(from_ring_order(y, u), self.group)

    def extra_repr(self) -> str:
        ring = f", ring over ranks {list(self.ring.ranks)}" if self.ring is not None else ""
        return f"all-to-all over ranks {list(self.group.ranks)}{ring}"


def hybrid_axes(mesh, a2a_size: int) -> tuple[Axis, Axis]:
    """(the all-to-all group: `a2a_size` consecutive ranks of this rank's cp group, the
    ring: the ranks at the same place of every such group). Every rank must call it, in
    the same order: it creates process groups for all the mesh's cp groups."""
    cp = mesh.cp
    if a2a_size == cp.size:
        return cp, Axis("cp", (mesh.rank,), 0, None)
    if a2a_size == 1:
        return Axis("cp", (mesh.rank,), 0, None), cp
    cp_groups = layout(mesh.dp_size, mesh.pp_size, mesh.tp_size, cp=mesh.cp_size)["cp"]
    runs = [g[i:i + a2a_size] for g in cp_groups for i in range(0, len(g), a2a_size)]
    rings = [g[i::a2a_size] for g in cp_groups for i in range(a2a_size)]
    return _axis(runs, mesh.rank), _axis(rings, mesh.rank)


def _axis(groups, me: int) -> Axis:
    mine = None
    for ranks in groups:  # every rank creates every group, in the same order
        group = dist.new_group(ranks)
        if me in ranks:
            mine = Axis("cp", tuple(ranks), ranks.index(me), group)
    return mine
