"""The attention core: softmax(QKᵀ/√d + causal mask) · V, its own module so that
selective recomputation, the activation ledger and context parallelism can name it.
Without the mask (``causal=False``) every position sees every other: a vision
encoder's attention over an image's patches (`minitp.model.vision`).

Packed documents (`minitp.data.packing`): ``positions`` (B, T), each token's position in
its document, restarting at 0 where one starts. The mask then becomes block-diagonal:
query i sees key j if j ≤ i and both are in the same document (`keep_mask`). A token
always sees itself, so no row of scores is ever wholly masked."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTIONS = ("math", "sdpa")  # how AttentionCore computes: see its docstring


def document_ids(positions: torch.Tensor) -> torch.Tensor:
    """(B, T) positions -> (B, T) document index: how many documents began at or before
    each token (a row that opens inside a document, its positions not at 0, counts it as 0)."""
    return (positions == 0).cumsum(-1)


def keep_mask(positions, q_index: torch.Tensor, k_index: torch.Tensor) -> torch.Tensor:
    """Which (query, key) pairs the causal mask keeps, for queries and keys at global
    indices `q_index`, `k_index` of the sequence: (Tq, Tk), key before or at the query;
    with `positions` (B, T) (packed documents) also in the same document: (B, 1, Tq, Tk),
    broadcast over the heads. Every rank of a context-parallel group holds the whole
    sequence's positions, so it can mask any chunk against any other."""
    keep = k_index[None, :] <= q_index[:, None]
    if positions is None:
        return keep
    docs = document_ids(positions)
    same = docs[:, q_index, None] == docs[:, None, k_index]  # (B, Tq, Tk)
    return (keep & same).unsqueeze(1)


class AttentionCore(nn.Module):
    """softmax(QKᵀ/√d + causal mask) · V, with dropout on the probabilities.

    attention="math" writes it out: the scores and probabilities are tensors that
    autograd keeps for backward (the 5as/h term of Korthikanti et al.'s activation
    formula). "sdpa" calls `F.scaled_dot_product_attention`, one fused kernel (flash
    attention on a GPU) that keeps neither and recomputes them in its backward.
    """

    def __init__(self, dropout: float, attention: str = "math", causal: bool = True):
        super().__init__()
        self.attention, self.causal = attention, causal
        self.dropout = nn.Dropout(dropout)

    def forward(self, q, k, v, positions=None):  # (B, nh, T, hs); k, v (B, nkv, T, hs)
        grouped = k.shape[1] != q.shape[1]  # each K/V head serves nh/nkv query heads
        T, Tk = q.shape[-2], k.shape[-2]  # Tk > T: the last T queries of a KV cache's Tk keys
        packed = positions is not None and self.causal
        if packed:  # the block-diagonal causal mask, (B, 1, T, T)
            index = torch.arange(T, device=q.device)
            keep = keep_mask(positions.to(q.device), index, index)
        if self.attention == "sdpa":  # GPTConfig refuses sdpa with dropout
            if Tk != T and self.causal:  # decoding: one query sees every key; more, a band
                mask = None if T == 1 else _causal(T, Tk, q.device)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
            if packed:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=grouped)
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                                  enable_gqa=grouped)
        if grouped:  # written out: each K/V head repeated for its group
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
        if packed:
            scores = scores.masked_fill(~keep, float("-inf"))
        elif self.causal:
            scores = scores.masked_fill(~_causal(T, Tk, q.device), float("-inf"))
        probs = self.dropout(F.softmax(scores, dim=-1))
        return probs @ v  # (B, nh, T, hs)


def _causal(T: int, Tk: int, device) -> torch.Tensor:
    """(T, Tk) the causal mask of T queries at the last T of Tk positions: key j ≤ query i."""
    return torch.ones(T, Tk, dtype=torch.bool, device=device).tril(Tk - T)
