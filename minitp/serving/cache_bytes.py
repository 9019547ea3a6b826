"""What a rank's KV cache holds, MEASURED: the bytes of the cache's own tensors after a
prefill, per rank. For latent attention (`minitp.model.mla`) every tp rank's cache holds
the whole latent and rotary key, (kv_lora_rank + rope_dim)·layers·bytes a token: tp does not
divide it, where it divides GQA's K/V heads. `minitp.calc.attention_dp_cache_bytes` is the
MODEL beside it, with what attention data parallelism would hold instead.
"""

from __future__ import annotations

import torch

from ..model.kv_cache import KVCache


def cache_bytes_per_rank(model: torch.nn.Module, prompt: torch.Tensor) -> dict:
    """Prefill `prompt` (B, T) through a fresh `KVCache` bound to `model` (this rank's
    shard, from `minitp.serving.tp_model`, or a whole model) and read its tensors back:
    {"per_token": bytes one position of one sequence takes in every layer, "held": the bytes
    of the positions written (B·T of them), "tensors": each layer's cached tensors' shapes
    (for latent attention: c_KV (B, 1, capacity, kv_lora_rank) and k^R (B, 1, capacity,
    rope_dim))}."""
    cache = KVCache.for_model(model)
    with torch.no_grad(), cache.bound(model):
        model(prompt)
    per_token = cache.bytes_per_token()
    shapes = [(tuple(layer.k.shape), tuple(layer.v.shape)) for layer in cache.layers]
    return {"per_token": per_token, "held": per_token * prompt.numel(), "tensors": shapes}
