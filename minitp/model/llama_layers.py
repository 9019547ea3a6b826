"""The Llama-style parts of the plain GPT (`GPTConfig.llama`): RMSNorm, rotary
positions, grouped-query attention and the SwiGLU MLP.

Each one keeps the model's single forward and the names the parallel plans read
(``ln1``, ``attn.proj``, ``mlp.fc``, ``mlp.proj``), and each is laid out so that the
tensor-parallel split stays a plain contiguous slice: ``kv``'s features by K/V head,
``fc``'s gate and up features interleaved. No parallel code lives here either.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention_core import AttentionCore
from .config import GPTConfig
from .kv_cache import cache_start


def norm(cfg: GPTConfig) -> nn.Module:
    """The configuration's normalization: LayerNorm (GPT-2) or RMSNorm (Zhang and Sennrich
    2019; Llama), eps 1e-5 both."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=1e-5)
    return nn.LayerNorm(cfg.d_model, bias=cfg.bias)


def dropped(dropout: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`dropout(x)`, or `x` without the call for an `nn.Dropout` at p = 0 (the default): it
    is the identity, and a decode step of a small model spent ~3% of its time calling nine
    (so its hooks do not fire: hook the module before it). Any other module in its place
    (a pipeline stage's pass-through) is called."""
    return x if isinstance(dropout, nn.Dropout) and dropout.p == 0 else dropout(x)

class NoPositions(nn.Identity):
    """The position step of a model whose positions are rotary (inside attention): the
    token embeddings pass through, so every model keeps one forward and one ``wpe``."""

    def forward(self, x, positions=None):
        return x


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021, RoFormer; as in Llama): each pair of
    features (i, i + d/2) of a head's q and k turned by the angle p·θ^(−2i/d) of the
    token's position p, so that q·k depends on positions only through their difference.
    No weights. `positions` is what context parallelism replaces: a rank holding
    chunks of the sequence must turn each token by its *global* position. Packed
    documents pass `positions` (B, T): each token turned by its position in its document
    (`local` picks the tokens this module holds: all of them here)."""

    def __init__(self, head_dim: int, seq_len: int, theta: float):
        super().__init__()
        self.head_dim, self.seq_len, self.theta = head_dim, seq_len, theta
        self._tables = {}  # (length, dtype, device) -> (cos, sin): made once, not each step

    def positions(self, length: int, device) -> torch.Tensor:
        return torch.arange(length, device=device)

    def local(self, positions: torch.Tensor) -> torch.Tensor:
        return positions

    def forward(self, q, k, positions=None, start: int = 0):  # (B, nh, T, hs), (B, nkv, T, hs)
        if start:  # a KV cache's next positions, start..start+T−1
            cos, sin = self._angles(torch.arange(start, start + q.shape[-2], device=q.device),
                                    q.dtype)
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        if positions is not None:  # packed: per row, not cached (a new batch each step)
            cos, sin = self._angles(self.local(positions.to(q.device)), q.dtype)
            return _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
        key = (q.shape[-2], q.dtype, q.device)
        if key not in self._tables:
            self._tables[key] = self._table(*key)
        cos, sin = self._tables[key]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def _table(self, length: int, dtype, device):
        return self._angles(self.positions(length, device), dtype)

    def _angles(self, positions, dtype):
        """(cos, sin) of the angles of `positions` (any shape) -> (…, head_dim) each."""
        device = positions.device
        if int(positions.max()) >= self.seq_len:
            raise ValueError(f"a sequence of {int(positions.max()) + 1} tokens is longer than "
                             f"seq_len={self.seq_len}")
        # the angles in float64, whatever the model's dtype: bf16 cannot hold p·θ
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device)
        angles = positions.double()[..., None] * self.theta ** (-half / self.head_dim)
        return tuple(f(torch.cat([angles, angles], -1)).to(dtype) for f in (torch.cos, torch.sin))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}"


def _rotate(x, cos, sin):
    """x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁) for halves (x₁, x₂)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with K/V heads shared by groups of query heads (Ainslie et
    al. 2023; one K/V head for all: Shazeer 2019's multi-query attention).

    ``q`` projects to n_head heads, ``kv`` to n_kv_head (K, V) pairs, its output features
    ordered (group, k/v, head_dim) — so a contiguous block of them is whole groups, and a
    column split of ``kv`` *is* a split by K/V heads, as ``q``'s is by query heads. The
    core serves each K/V head to its n_head/n_kv_head query heads (`AttentionCore`; the
    ring of context parallelism carries them narrow). The counts are read from the
    projections' outputs: a tensor-parallel shard holds fewer."""

    kv_cache = None  # a LayerCache while a KVCache is bound (`minitp.model.kv_cache`)

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        # the one input q and kv both read: tensor parallelism maps it here, once (its f, or
        # its sequence all-gather), so that two projections cost one collective, not two
        self.shared_input = nn.Identity()
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim, bias=cfg.bias)
        self.rope = (Rotary(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
                     if cfg.positions == "rope" else None)
        self.core = AttentionCore(cfg.dropout, cfg.attention, cfg.causal)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, positions=None):  # (B, T, C); positions: packed documents'
        packed = {} if positions is None else {"positions": positions}
        x = self.shared_input(x)
        q, kv = self.q(x), self.kv(x)  # (B, T, nh'·hs), (B, T, nkv'·2·hs)
        B, T, _ = q.shape
        heads, groups = q.shape[-1] // self.head_dim, kv.shape[-1] // (2 * self.head_dim)
        q = q.view(B, T, heads, self.head_dim).transpose(1, 2)  # (B, nh', T, hs)
        k, v = kv.view(B, T, groups, 2, self.head_dim).permute(3, 0, 2, 1, 4).unbind(0)
        if self.rope is not None:
            q, k = self.rope(q, k, **packed, start=cache_start(self))
        if self.kv_cache is not None:  # decoding: K, V of every position so far
            k, v = self.kv_cache.append(k, v)
        y = self.core(q, k, v, **packed)  # the core serves each K/V head to its group of queries
        y = y.transpose(1, 2).reshape(B, T, heads * self.head_dim)  # (B, T, C')
        return dropped(self.dropout, self.proj(y))


class SwiGLU(nn.Module):
    """proj(silu(x·Gᵀ) ⊙ x·Uᵀ) (Shazeer 2020; Llama's MLP). The gate G and the up
    projection U are one ``fc`` whose output features alternate (gate_j, up_j): a
    contiguous block of them is whole pairs, so the column split that splits GPT-2's
    ``fc`` splits G and U *together* — laid out [G; U], rank 0 would get only gates."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 2 * cfg.ffn_width, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_width, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):  # (B, T, C)
        gate, up = self.fc(x).unflatten(-1, (-1, 2)).unbind(-1)  # each (B, T, f')
        return dropped(self.dropout, self.proj(F.silu(gate) * up))
