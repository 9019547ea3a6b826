"""The attention core: softmax(QKᵀ/√d + causal mask) · V, its own module so that
selective recomputation, the activation ledger and context parallelism can name it.
Without the mask (``causal=False``) every position sees every other: a vision
encoder's attention over an image's patches (`minitp.model.vision`)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTIONS = ("math", "sdpa")  # how AttentionCore computes: see its docstring


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

    def forward(self, q, k, v):  # (B, nh, T, hs); k, v (B, nkv, T, hs), nkv dividing nh
        grouped = k.shape[1] != q.shape[1]  # each K/V head serves nh/nkv query heads
        if self.attention == "sdpa":  # GPTConfig refuses sdpa with dropout
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                                  enable_gqa=grouped)
        if grouped:  # written out: each K/V head repeated for its group
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        T = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
        if self.causal:
            causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        probs = self.dropout(F.softmax(scores, dim=-1))
        return probs @ v  # (B, nh, T, hs)
