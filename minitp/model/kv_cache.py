"""A KV cache for the plain model: each layer's keys and values kept, so that a new token
attends to the past without recomputing it.

Prefill runs the prompt (B, T) through the model once and writes every layer's K and V for
its T positions; each decode step then runs one token (B, 1) and appends one position.
Without the cache, token t recomputes all t positions of every layer; with it, one.

The cache is bound to a model for a forward (`KVCache.bound`): each attention module and
the learned position table see their layer's `LayerCache` (an attribute, ``kv_cache``), so
the model keeps its one forward and needs no new argument. Bound to a tensor-parallel
rank's model, each layer's cache holds that rank's K/V heads only — it is made at the first
append, from the keys the rank computed; bound to a pipeline stage, its layers only.

Positions: a cache holds at most ``capacity`` of them (the model's ``seq_len``: learned
positions exist for no more, and `Rotary` refuses more). What a sequence does past that
is the caller's rule (`minitp.serving.decode.Decoder`: the last window re-prefilled).

Bytes per token: 2 (K and V) · layers · kv_heads · head_dim · bytes of the dtype — read
from the tensors by `KVCache.bytes_per_token`, for the layers and heads this process holds.
Latent attention (`minitp.model.mla`) keeps its latent in ``k`` and its rotary key in ``v``:
(kv_lora_rank + rope_dim) · layers · bytes.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn


class LayerCache:
    """One layer's keys and values: two (B, kv_heads, capacity, width) tensors, made at the
    first `append` in its dtype and device, and ``length`` positions of them filled (width
    head_dim each; latent attention's: kv_lora_rank for ``k``, rope_dim for ``v``)."""

    def __init__(self, capacity: int):
        self.capacity, self.length = capacity, 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor):
        """Write `k`, `v` (B, kv_heads, T, head_dim) at positions length..length+T−1; return
        the keys and values of every position so far, (B, kv_heads, length, head_dim) each."""
        if self.k is None:  # each its own width: latent attention keeps (c_KV, k^R) here
            self.k, self.v = (torch.zeros((t.shape[0], t.shape[1], self.capacity, t.shape[3]),
                                          dtype=t.dtype, device=t.device) for t in (k, v))
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions (seq_len): "
                             f"{self.length} held and {k.shape[2]} more do not fit")
        if k.shape[0] != self.k.shape[0]:
            raise ValueError(f"the KV cache was made for a batch of {self.k.shape[0]} "
                             f"sequences, got {k.shape[0]}")
        # narrow, not slicing: the same views, without Python's indexing (a decode step's ~2%)
        self.k.narrow(2, self.length, k.shape[2]).copy_(k)
        self.v.narrow(2, self.length, v.shape[2]).copy_(v)
        self.length = end
        return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end)


class KVCache:
    """Every layer's `LayerCache` of one batch of sequences, for a model (or a pipeline
    stage: its layers) of `n_layer` layers, ``capacity`` positions each."""

    def __init__(self, n_layer: int, capacity: int):
        self.capacity = capacity
        self.layers = [LayerCache(capacity) for _ in range(n_layer)]

    @classmethod
    def for_model(cls, model: nn.Module) -> KVCache:
        """A cache for `model`'s layers (its ``blocks``), seq_len positions."""
        return cls(len(model.blocks), model.cfg.seq_len)

    @property
    def length(self) -> int:
        """The positions held (the same in every layer between forwards)."""
        return self.layers[0].length if self.layers else 0

    @property
    def nbytes(self) -> int:
        """The bytes the cache's tensors hold, allocated for all ``capacity`` positions."""
        return sum(t.numel() * t.element_size()
                   for layer in self.layers for t in (layer.k, layer.v) if t is not None)

    def bytes_per_token(self) -> int:
        """Bytes of K and V one sequence's one position takes in every layer: measured, the
        tensors' bytes over (batch · capacity); the formula is 2·layers·kv_heads·head_dim·bytes."""
        made = [layer.k for layer in self.layers if layer.k is not None]
        if not made:
            raise ValueError("the KV cache is empty: run a prefill first")
        return self.nbytes // (made[0].shape[0] * self.capacity)

    @contextlib.contextmanager
    def bound(self, model: nn.Module):
        """Within: `model`'s forward reads and writes this cache (its attention modules and
        learned positions see their layer's cache; a position table reads layer 0's length,
        so it turns positions length..length+T−1, not 0..T−1)."""
        blocks = list(model.blocks)
        if len(blocks) != len(self.layers):
            raise ValueError(f"a KV cache of {len(self.layers)} layers bound to a model of "
                             f"{len(blocks)}")
        holders = [(block.attn, layer) for block, layer in zip(blocks, self.layers, strict=True)]
        if hasattr(type(model.wpe), "kv_cache"):  # learned positions (not rotary, not skipped)
            holders.append((model.wpe, self.layers[0]))
        # a plain attribute (a LayerCache is no module, parameter or buffer): set past
        # nn.Module's __setattr__, whose bookkeeping would cost a decode step ~1%
        for module, layer in holders:
            object.__setattr__(module, "kv_cache", layer)
        try:
            yield self
        finally:
            for module, _ in holders:
                object.__setattr__(module, "kv_cache", None)


def cache_start(module: nn.Module) -> int:
    """The position the forward's first token is at: the bound cache's length, else 0."""
    cache = getattr(module, "kv_cache", None)
    return 0 if cache is None else cache.length
