"""The KV cache of multi-head latent attention beside grouped-query and multi-head
attention's (a MODEL: bytes a token, from the shapes).

A GQA layer caches K and V of each K/V head: 2·kv_heads·head_dim values a token
(`kv_cache_bytes_per_token`). An MLA layer (`minitp.model.mla`) caches its latent c_KV and
the one rotary key k^R shared by every head: kv_lora_rank + rope_dim values, whatever the
heads (DeepSeek-V2, arXiv 2405.04434, §2.1.4 and Table 1: "(d_c + d_h^R)·l" elements, against
MHA's 2·n_h·d_h·l and GQA's 2·n_g·d_h·l). `minitp.model.kv_cache.KVCache.bytes_per_token`
measures the same number from a model's cache tensors (tests/model/test_mla.py).

Under tensor parallelism the latent is replicated on every tp rank (each rank's heads read
all of it), so tp does not divide it as it divides GQA's split K/V heads — the reason
serving stacks decode MLA with attention data parallelism (jax-ml/scaling-book #90):
`attention_dp_cache_bytes` sets the two per rank side by side.

Shape: `DEEPSEEK_V3_LATENT` (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv
2412.19437, §4.2: 61 layers, 128 heads of d_h 128, d_c 512, d_h^R 64).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEEPSEEK_V3_LATENT", "LatentShape", "attention_dp_cache_bytes",
           "latent_vs_heads_cache", "mla_cache_bytes_per_token"]


@dataclass(frozen=True)
class LatentShape:
    """A published latent-attention model's cache-relevant sizes."""

    name: str
    n_layer: int
    n_head: int
    head_dim: int
    kv_lora_rank: int
    rope_dim: int
    source: str


DEEPSEEK_V3_LATENT = LatentShape(
    "DeepSeek-V3", n_layer=61, n_head=128, head_dim=128, kv_lora_rank=512, rope_dim=64,
    source="DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv 2412.19437), §4.2: 61 "
           "Transformer layers, 128 attention heads, per-head dimension d_h 128, KV compression "
           "dimension d_c 512, decoupled query/key per-head dimension d_h^R 64")


def mla_cache_bytes_per_token(kv_lora_rank: int, rope_dim: int, n_layer: int,
                              bytes_per_value: int = 2) -> int:
    """(kv_lora_rank + rope_dim) · n_layer · bytes: one token's latent and rotary key, every
    layer (on every tp rank: the latent is replicated over tp)."""
    for name, value in (("kv_lora_rank", kv_lora_rank), ("rope_dim", rope_dim),
                        ("n_layer", n_layer), ("bytes_per_value", bytes_per_value)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return (kv_lora_rank + rope_dim) * n_layer * bytes_per_value


def latent_vs_heads_cache(shape: LatentShape = DEEPSEEK_V3_LATENT, bytes_per_value: int = 2,
                          kv_heads: int = 8) -> dict:
    """Bytes a token of `shape`'s cache as MLA, as multi-head attention (a K and V per head)
    and as GQA with `kv_heads` K/V heads of the same head_dim: {"mla", "mha", "gqa"}."""
    per_head = 2 * shape.head_dim * shape.n_layer * bytes_per_value
    return {"mla": mla_cache_bytes_per_token(shape.kv_lora_rank, shape.rope_dim,
                                             shape.n_layer, bytes_per_value),
            "mha": shape.n_head * per_head, "gqa": kv_heads * per_head}


def attention_dp_cache_bytes(shape: LatentShape, requests: int, context: int, ranks: int,
                             bytes_per_value: int = 2) -> dict:
    """MODEL: the latent cache one rank holds when `ranks` GPUs serve `requests` sequences of
    `context` tokens each, two ways. {"tp": attention split over tp = ranks — every rank's
    heads read the whole latent, so every rank holds every request's (measured in
    tests/tensor_parallel/test_mla_tp.py: `minitp.serving.cache_bytes.cache_bytes_per_rank`);
    "attention_dp": attention data-parallel — each rank runs whole attention for its own
    ceil(requests/ranks) requests and holds only their latent; "ratio": tp's over
    attention DP's}. The observation is jax-ml/scaling-book issue #90's; serving stacks do
    it: SGLang's DP attention (docs.sglang.io, advanced_features/dp_dpa_smg_guide: MLA "only
    has one KV head", so TP on 8 GPUs duplicates the KV cache on every GPU) and vLLM's
    data-parallel attention for MLA models (docs.vllm.ai, serving/data_parallel_deployment).
    Not modelled: attention DP's cost, the weights of attention whole on every rank and the
    all-gather or all-to-all that hands the MLP (or experts) the tokens of every rank."""
    for name, value in (("requests", requests), ("context", context), ("ranks", ranks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    token = mla_cache_bytes_per_token(shape.kv_lora_rank, shape.rope_dim, shape.n_layer,
                                      bytes_per_value)
    tp = requests * context * token
    dp = -(-requests // ranks) * context * token
    return {"tp": tp, "attention_dp": dp, "ratio": tp / dp}
