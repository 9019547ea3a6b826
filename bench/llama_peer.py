"""The plain-PyTorch Llama-style peer of `bench/gpt_step.py --arch llama`.

Written as the Llama reference and torchtitan write the layer: RMSNorm (torch's),
rotary embeddings from cos/sin tables built once, grouped-query attention through
`F.scaled_dot_product_attention(..., enable_gqa=True)` (the K/V heads never
repeated), a SwiGLU MLP of three bias-free linears, pre-norm, the output tied to the
token embedding as minitp's. `copy_from` takes minitp's weights (its ``fc`` holds
gate and up interleaved; its ``kv`` holds (K/V head, k/v, dim) rows).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_tables(head_dim, seq, theta):
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv
    angles = torch.cat([angles, angles], -1)
    return angles.cos().float(), angles.sin().float()


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LlamaPeerBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.attention_norm, self.ffn_norm = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, hidden, bias=False)  # gate
        self.w3 = nn.Linear(d, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, d, bias=False)  # down

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LlamaPeer(nn.Module):
    def __init__(self, layers, heads, kv_heads, d, seq, vocab, hidden, theta=10000.0):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaPeerBlock(d, heads, kv_heads, hidden)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-5)
        cos, sin = rope_tables(d // heads, seq, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.norm(x) @ self.tok_embeddings.weight.T
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def copy_from(peer: LlamaPeer, ref) -> None:
    """minitp's `GPT(GPTConfig.llama(...))` weights into the peer."""
    hd, kv = ref.cfg.head_dim, ref.cfg.kv_heads
    with torch.no_grad():
        peer.tok_embeddings.weight.copy_(ref.wte.weight)
        peer.norm.weight.copy_(ref.ln_f.weight)
        for mine, theirs in zip(peer.layers, ref.blocks, strict=True):
            mine.attention_norm.weight.copy_(theirs.ln1.weight)
            mine.ffn_norm.weight.copy_(theirs.ln2.weight)
            mine.wq.weight.copy_(theirs.attn.q.weight)
            k, v = theirs.attn.kv.weight.view(kv, 2, hd, -1).unbind(1)  # (K/V head, k/v, dim)
            mine.wk.weight.copy_(k.reshape(kv * hd, -1))
            mine.wv.weight.copy_(v.reshape(kv * hd, -1))
            mine.wo.weight.copy_(theirs.attn.proj.weight)
            gate, up = theirs.mlp.fc.weight.view(-1, 2, ref.cfg.d_model).unbind(1)  # interleaved
            mine.w1.weight.copy_(gate)
            mine.w3.weight.copy_(up)
            mine.w2.weight.copy_(theirs.mlp.proj.weight)
