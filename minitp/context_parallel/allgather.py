"""All-gather context parallelism (Megatron-LM's ``--cp-comm-type allgather``; what
Llama 3's long-context training used: Dubey et al. 2024, "The Llama 3 Herd of Models"):
K and V are gathered once over cp, and each rank attends its own query chunks (the
load-balanced split) to the whole sequence's keys, under the causal mask at global
positions.

Forward: one all-gather of K and one of V over cp (each rank sends its share to the
cp−1 others). Backward: every rank's queries produced a gradient for every key, so the
gathered K's and V's gradients are partial sums; a reduce-scatter sums them and hands
each rank its own chunks' — SP's gather pair (`tensor_parallel.mappings`), along the
sequence. The rank keeps the whole K and V for backward: s, not s/cp, positions of them.

``regather=True`` (cp_comm "allgather-regather") is TransformerEngine's
``AttnFuncWithCPAndKVAllGather`` (transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py, what Megatron-LM's ``allgather`` runs): backward all-gathers K and V
again, so only the rank's own K and V are kept — 1/cp of them for 1.5 times the bytes,
6(cp−1) shares of K or V where the kept variant sends 4(cp−1). Here the core runs under
non-reentrant checkpointing, which keeps its inputs (Q, K, V at s/cp) and reruns gather and
attention in backward; TE's flash kernel keeps its output and log-sum-exp as well and reruns
only the gather and the probabilities (flash attention recomputes those anyway).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..model.attention_core import keep_mask
from ..runtime import trace
from ..runtime.mesh import Axis
from ..tensor_parallel import mappings
from .split import global_positions, merge_sequence


def gather_keys(t: torch.Tensor, cp: Axis) -> torch.Tensor:
    """(B, h, 2c, hs) this rank's chunks -> (B, h, 2c·cp, hs) the whole sequence in global
    order, every rank; backward: the gradients summed over cp, each rank its chunks."""
    gathered = mappings.gather_from_sequence(t.transpose(1, 2), cp, grad_is_partial=True)
    whole = merge_sequence(list(gathered.chunk(cp.size, dim=1)), dim=1)  # rank -> global order
    return whole.transpose(1, 2)


def masked_attention(q, k, v, keep: torch.Tensor, attention: str = "math"):
    """softmax(QKᵀ/√d, masked where `keep` is False)·V; k, v may have fewer heads (GQA).
    attention: "math" written out (scores kept for backward), or "sdpa" (one kernel)."""
    grouped = k.shape[1] != q.shape[1]
    if attention == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=grouped)
    if grouped:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return F.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v


def allgather_attention(q, k, v, cp: Axis, attention: str = "math", positions=None,
                        regather: bool = False):
    """Causal attention of this cp rank's queries (its two chunks, (B, nh, 2c, hs)) over
    the whole sequence's K and V, gathered once (k, v (B, nkv, 2c, hs), nkv dividing nh).
    positions: packed documents', (B, s) the whole sequence's: masked within documents too.
    regather: keep only this rank's K and V and gather them again in backward (the module)."""
    if regather and torch.is_grad_enabled():
        # Backward reruns this inside autograd, long after the forward's trace label
        # ended: carry the label along, as `minitp.recompute.Recomputed` does. No random
        # draw inside (no dropout), so there is no generator state to keep.
        return checkpoint(_relabelled, trace.recorder().label, q, k, v, cp, attention,
                          positions, use_reentrant=False, preserve_rng_state=False)
    with trace.label("allgather K/V"):
        k, v = gather_keys(k, cp), gather_keys(v, cp)
    mine = global_positions(q.shape[-2], cp, q.device)
    if positions is not None:
        positions = positions.to(q.device)
    keep = keep_mask(positions, mine, torch.arange(k.shape[-2], device=q.device))  # (…, 2c, s)
    return masked_attention(q, k, v, keep, attention)


def _relabelled(label, q, k, v, cp, attention, positions):
    with trace.relabel(label):
        return allgather_attention(q, k, v, cp, attention, positions)


class AllGatherAttention(nn.Module):
    """The attention core of a context-parallel rank, K/V all-gathered (replaces
    `AttentionCore`; keeps its "math" or "sdpa"); regather: gathered again in backward."""

    def __init__(self, cp: Axis, attention: str = "math", regather: bool = False):
        super().__init__()
        self.cp, self.attention, self.regather = cp, attention, regather

    def forward(self, q, k, v, positions=None):  # each (B, h, 2c, hs)
        return allgather_attention(q, k, v, self.cp, self.attention, positions, self.regather)

    def extra_repr(self) -> str:
        again = ", gathered again in backward" if self.regather else ""
        return (f"K/V all-gathered over {self.cp.name} ranks {list(self.cp.ranks)}, "
                f"{self.attention}{again}")
