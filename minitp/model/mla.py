"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434, §2.1.2–2.1.3, eqs. 9–19;
DeepSeek-V3, arXiv 2412.19437, §2.1.1, eqs. 1–11): K and V up-projected, per head, from one
small latent c_KV a token, so that a KV cache holds the latent, not the heads' K and V.

For token t, h_t its input (d_model), n_h heads of d_h = d_model/n_head each:

    c_KV = W^DKV h_t                      (kv_lora_rank)     eq. 9  (V2)
    k^C_i = W^UK_i c_KV,  v_i = W^UV_i c_KV  (d_h each)      eqs. 10–11
    c_Q = W^DQ h_t  (q_lora_rank; 0: q = W^UQ h_t, no compression, V2-Lite's choice)  eq. 12
    q^C_i = W^UQ_i c_Q,  q^R_i = RoPE(W^QR_i c_Q)  (d_h, rope_dim)  eqs. 13, 14
    k^R = RoPE(W^KR h_t)   (rope_dim, ONE for all heads: the decoupled rotary key)  eq. 15
    q_i = [q^C_i; q^R_i],  k_i = [k^C_i; k^R]  eqs. 16–17
    o_i = softmax(q_i·k_i / √(d_h + rope_dim)) · v_i,  u = W^O [o_1; …; o_n]  eqs. 18–19

RoPE cannot sit on k^C: a rotation between W^UK and the query would stop W^UK being folded
into the query for decode (§2.1.3); so position rides on a separate narrow key, shared by
the heads. c_KV and c_Q pass an RMSNorm (V2 §3.1.2, its hyper-parameters: an RMSNorm after
each compressed latent vector; V2's Appendix C sets every formula out together). The cache
(`minitp.model.kv_cache`) holds normed c_KV and k^R: (kv_lora_rank + rope_dim) values a token
a layer, for any number of heads.

Absorption (V2 §2.1.2: at inference W^UK is absorbed into the query's W^UQ and W^UV into
W^O, so no key or value need be computed): q^C_i·k^C_i =
(W^UK_iᵀ q^C_i)·c_KV, and Σ p v_i = W^UV_i (Σ p c_KV); with ``absorb`` set, attention runs
on the latent itself, one 'head' every query head reads, and no K or V is ever made.
Rotation: minitp's `Rotary` turns halves (Llama's), DeepSeek's code turns adjacent pairs —
the same rotation after a fixed permutation of W^QR's and W^KR's rows.

Layout for tensor parallelism (`minitp.tensor_parallel.plan`): ``q_up``'s features ordered
(head, nope/rope), ``kv_up``'s (head, k/v, d_h), so a contiguous block is whole heads.
``keys`` hands (c_KV, k^R) on unchanged: context parallelism replaces it with their
all-gather over cp (`minitp.context_parallel.latent`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .attention_core import AttentionCore
from .config import GPTConfig
from .kv_cache import cache_start
from .llama_layers import Rotary, dropped

# The modules every tensor-parallel rank holds whole (the down-projections, their norms and
# the shared rotary key's projection), named once for the plan and the tests.
REPLICATED = ("q_down", "q_norm", "kv_down", "kv_norm", "k_rope")


class MadeKeys(nn.Module):
    """(c_KV, k^R) as this rank made them: the one place where context parallelism gathers
    the whole sequence's (`minitp.context_parallel.latent`); on one device, nothing."""

    def forward(self, latent, k_pe):
        return latent, k_pe


class LatentAttention(nn.Module):
    """Causal self-attention through a K/V latent (see the module docstring). ``absorb``:
    W^UK folded into the query and W^UV into the output (decode's form); same function."""

    kv_cache = None  # a LayerCache while a KVCache is bound: it holds (c_KV, k^R)
    absorb = False

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim, self.rope_dim = cfg.head_dim, cfg.rope_dim
        width = cfg.n_head * (cfg.head_dim + cfg.rope_dim)  # q^C and q^R of every head
        # the one input every projection reads: tensor parallelism maps it here, once
        self.shared_input = nn.Identity()
        q_in = cfg.q_lora_rank or cfg.d_model
        self.q_down = (nn.Linear(cfg.d_model, cfg.q_lora_rank, bias=cfg.bias)  # W^DQ
                       if cfg.q_lora_rank else None)
        self.q_norm = nn.RMSNorm(cfg.q_lora_rank, eps=1e-5) if cfg.q_lora_rank else None
        self.q_up = nn.Linear(q_in, width, bias=cfg.bias)  # [W^UQ_i; W^QR_i], head by head
        self.kv_down = nn.Linear(cfg.d_model, cfg.kv_lora_rank, bias=cfg.bias)  # W^DKV
        self.kv_norm = nn.RMSNorm(cfg.kv_lora_rank, eps=1e-5)
        self.kv_up = nn.Linear(cfg.kv_lora_rank, 2 * cfg.d_model, bias=cfg.bias)  # [W^UK_i; W^UV_i]
        self.k_rope = nn.Linear(cfg.d_model, cfg.rope_dim, bias=cfg.bias)  # W^KR, shared by heads
        self.rope = Rotary(cfg.rope_dim, cfg.seq_len, cfg.rope_theta)
        self.keys = MadeKeys()  # the latent and k^R every head's K and V are made from
        self.core = AttentionCore(cfg.dropout, cfg.attention, cfg.causal)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)  # W^O
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, positions=None):  # (B, T, C); positions: packed documents'
        packed = {} if positions is None else {"positions": positions}
        x = self.shared_input(x)
        c_q = x if self.q_down is None else self.q_norm(self.q_down(x))
        q = self.q_up(c_q)  # (B, T, nh'·(hs + r)): nh' the heads this module holds
        B, T, _ = q.shape
        heads = q.shape[-1] // (self.head_dim + self.rope_dim)
        q_nope, q_pe = q.view(B, T, heads, -1).transpose(1, 2).split(
            [self.head_dim, self.rope_dim], dim=-1)  # (B, nh', T, hs), (B, nh', T, r)
        latent = self.kv_norm(self.kv_down(x))  # (B, T, dc)
        k_pe = self.k_rope(x)[:, None]  # (B, 1, T, r): one rotary key for every head
        q_pe, k_pe = self.rope(q_pe, k_pe, **packed, start=cache_start(self))
        latent, k_pe = self.keys(latent[:, None], k_pe)  # (B, 1, T, dc), (B, 1, T, r)
        if self.kv_cache is not None:  # decoding: the latent and k^R of every position so far
            latent, k_pe = self.kv_cache.append(latent, k_pe)
        if self.absorb:
            y = self._absorbed(q_nope, q_pe, latent, k_pe, packed)
        else:
            y = self._expanded(q_nope, q_pe, latent, k_pe, packed)
        y = y.transpose(1, 2).reshape(B, T, heads * self.head_dim)  # (B, T, C')
        return dropped(self.dropout, self.proj(y))

    def _expanded(self, q_nope, q_pe, latent, k_pe, packed):
        """Training's form: each head's K and V made from the latent (eqs. 10–11, 16–18)."""
        B, heads, _, hs = q_nope.shape
        Tk = latent.shape[2]
        kv = self.kv_up(latent[:, 0]).view(B, Tk, heads, 2, hs)
        k_nope, v = kv.permute(3, 0, 2, 1, 4).unbind(0)  # each (B, nh', Tk, hs)
        k = torch.cat([k_nope, k_pe.expand(-1, heads, -1, -1)], dim=-1)
        return self.core(torch.cat([q_nope, q_pe], dim=-1), k, v, **packed)

    def _absorbed(self, q_nope, q_pe, latent, k_pe, packed):
        """Decode's form: q^C·W^UK·c and W^UV·(Σ p c), the latent itself the one K/V head
        (a K bias adds q·b to every score of a query: softmax ignores it; V's is added)."""
        heads, hs = q_nope.shape[1], self.head_dim
        w = self.kv_up.weight.view(heads, 2, hs, -1)  # (nh', k/v, hs, dc)
        q_latent = q_nope @ w[:, 0]  # (B, nh', T, dc) = W^UKᵀ q^C
        # the core divides by √(its width); the scores must keep eq. 18's √(hs + r)
        scale = math.sqrt((q_latent.shape[-1] + self.rope_dim) / (hs + self.rope_dim))
        q = torch.cat([q_latent, q_pe], dim=-1) * scale
        k = torch.cat([latent, k_pe], dim=-1)  # (B, 1, Tk, dc + r)
        y = self.core(q, k, latent, **packed) @ w[:, 1].transpose(-2, -1)  # (B, nh', T, hs)
        if self.kv_up.bias is not None:
            y = y + self.kv_up.bias.view(heads, 2, hs)[None, :, 1, None]
        return y


def set_absorbed(model: nn.Module, absorb: bool = True) -> None:
    """Every latent attention of `model` in decode's absorbed form (or back)."""
    for module in model.modules():
        if isinstance(module, LatentAttention):
            module.absorb = absorb
