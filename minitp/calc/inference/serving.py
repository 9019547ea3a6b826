"""Serving: prefill and decode — FLOPs, the bytes read per token, and time per token (a model).

Decoding makes one token per sequence per step. Every step reads every weight matrix
once, shared by the B sequences of the batch, and each sequence's whole KV cache; it does
2 FLOPs per weight per token and, in attention, 4·d FLOPs per query head per cached
position (q·k and the weighted sum of v). So a step's arithmetic intensity is about

    I = 2BN / (N·w + B·T·c)        (N weights, w bytes each, T cached positions,
                                     c = 2·L·K·d·w bytes of cache per position)

— near B FLOPs per byte at bf16 while the cache is small, and never above 2N/(T·c) + 2H/(K·w)
however large the batch (the weights' FLOPs, and attention's H query heads reading K).
Against the machine's balance point (peak FLOP/s ÷ memory bytes/s, `Cluster.balance_point`),
decode is bound by memory bandwidth until B reaches it.

Time per step is the Scaling Book's model (Austin et al. 2025, "How to Scale Your Model",
§7 "All About Transformer Inference", jax-ml/scaling-book inference.md, "Theoretical
estimates for LLM latency and throughput"): the cache read at bandwidth, plus the larger of
the weights' FLOPs at peak and the weights' read at bandwidth; to which tensor parallelism
adds its two all-reduces of B·h values per layer (after attention, after the MLP) at the
cluster's α–β cost, priced as a ring (2(t−1) hops) or as vLLM's one-shot all-reduce (one
hop, every peer's buffer read: `minitp.calc.network.allreduce`). tp divides the weights and the
cache a rank reads (its K/V heads: `minitp.rules.kv_layout`), not the all-reduces: where
their cost outgrows the reads it saves, more tp stops paying — a ring's latency grows with
t, a one-shot's does not. Everything here is a MODEL: peaks, not measured kernels.

Shapes: `LLAMA3_8B` and `LLAMA3_70B` (Meta, "The Llama 3 Herd of Models", Dubey et al.
2024, arXiv 2407.21783, Table 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ...rules import kv_layout
from .._util import number
from ..counts.params import latent, params_per_rank
from ..network.allreduce import allreduce_time
from ..network.cluster import Cluster
from .latent_cache import mla_cache_bytes_per_token

__all__ = [
    "LLAMA3_8B", "LLAMA3_70B", "DecoderShape", "DecodeTime", "decode_flops_per_token",
    "decode_bytes_per_step", "decode_intensity", "decode_step_time", "decode_vs_tp",
    "critical_batch", "kv_cache_bytes_per_token", "max_decode_batch", "prefill_flops",
    "tp_stops_paying", "weight_params_read",
]


@dataclass(frozen=True)
class DecoderShape:
    """A published decoder's sizes, under the names `minitp.GPTConfig` uses (so every
    `minitp.calc` function reads it): Llama's parts, untied embeddings."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    source: str
    norm: str = "rmsnorm"
    positions: str = "rope"
    mlp: str = "swiglu"
    bias: bool = False

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn_width(self) -> int:
        return self.ffn_hidden


_TABLE3 = ("Dubey et al. 2024, 'The Llama 3 Herd of Models' (arXiv 2407.21783), Table 3: "
           "{}. Vocabulary 128,256 (Table 3 rounds it to 128,000): the released config.json, "
           "as the Scaling Book's §6 (applied-training.md) tabulates it.")
LLAMA3_8B = DecoderShape(
    "Llama 3 8B", n_layer=32, d_model=4096, n_head=32, n_kv_head=8, ffn_hidden=14336,
    vocab_size=128256, seq_len=8192,
    source=_TABLE3.format("32 layers, model dimension 4,096, FFN dimension 14,336, 32 "
                          "attention heads, 8 key/value heads"))
LLAMA3_70B = DecoderShape(
    "Llama 3 70B", n_layer=80, d_model=8192, n_head=64, n_kv_head=8, ffn_hidden=28672,
    vocab_size=128256, seq_len=8192,
    source=_TABLE3.format("80 layers, model dimension 8,192, FFN dimension 28,672, 64 "
                          "attention heads, 8 key/value heads"))


def _check(**sizes):
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _flops_per_head_and_key(cfg, decode: bool) -> int:
    """Attention's FLOPs per query head per cached key: 4·d (QKᵀ and ·V, d wide each).
    Latent attention (`minitp.calc.architectures.mla`): decode absorbed, the core reading
    the latent as its one K/V head, 2(d_c + d_h^R) + 2d_c; prefill expanded, as training
    runs it, 2(d + d_h^R) + 2d. W^UK and W^UV stay 2 FLOPs per weight either way (applied
    to the query and the output when absorbed, to the keys when expanded)."""
    if not latent(cfg):
        return 4 * cfg.head_dim
    if decode:
        return 2 * (2 * cfg.kv_lora_rank + cfg.rope_dim)
    return 2 * (2 * cfg.head_dim + cfg.rope_dim)


def weight_params_read(cfg, tp: int = 1) -> int:
    """Weights one tp rank reads per decode step: its share of every layer and of the
    output layer (the vocab-parallel V·h/t). An untied input embedding is not counted: a
    step reads one row of it per sequence. = `params_per_rank(cfg, tp)`."""
    return params_per_rank(cfg, tp)


def kv_cache_bytes_per_token(cfg, bytes_per_value: int = 2, tp: int = 1) -> int:
    """Bytes of K and V one position adds to one rank's cache: 2·L·K_t·d·w, K_t the K/V
    heads the rank keeps (K/t when tp divides them; one, copied, when tp exceeds them).
    Latent attention: its latent and rotary key, whole on every rank (`latent_cache`)."""
    if latent(cfg):
        return mla_cache_bytes_per_token(cfg.kv_lora_rank, cfg.rope_dim, cfg.n_layer,
                                         bytes_per_value)
    kv = Fraction(cfg.kv_heads, tp) if kv_layout(cfg, tp) == "split" else 1
    return number(2 * cfg.n_layer * kv * cfg.head_dim * bytes_per_value)


def decode_flops_per_token(cfg, context: int, tp: int = 1) -> int:
    """FLOPs one rank does for one sequence's token: 2 per weight read, and 4·d per query
    head per cached position (``context`` positions, the new one included; latent
    attention absorbed: `_flops_per_head_and_key`)."""
    _check(context=context, tp=tp)
    heads = cfg.n_head // tp
    per_key = _flops_per_head_and_key(cfg, decode=True)
    return 2 * weight_params_read(cfg, tp) + cfg.n_layer * heads * per_key * context


def prefill_flops(cfg, prompt: int, tp: int = 1) -> int:
    """FLOPs one rank does to prefill one prompt of ``prompt`` tokens: 2 per weight per
    token, and attention's 4·d per query head per (query, key) pair, causal: P(P+1)/2
    (latent attention expanded: `_flops_per_head_and_key`)."""
    _check(prompt=prompt, tp=tp)
    pairs = prompt * (prompt + 1) // 2
    heads = cfg.n_head // tp
    per_key = _flops_per_head_and_key(cfg, decode=False)
    return 2 * weight_params_read(cfg, tp) * prompt + cfg.n_layer * heads * per_key * pairs


def decode_bytes_per_step(cfg, batch: int, context: int, bytes_per_value: int = 2,
                          tp: int = 1) -> int:
    """Bytes one rank reads in one decode step: its weights once, and each of the
    ``batch`` sequences' cache of ``context`` positions."""
    _check(batch=batch, context=context, tp=tp)
    weights = weight_params_read(cfg, tp) * bytes_per_value
    return weights + batch * context * kv_cache_bytes_per_token(cfg, bytes_per_value, tp)


def decode_intensity(cfg, batch: int, context: int, bytes_per_value: int = 2,
                     tp: int = 1) -> float:
    """A decode step's arithmetic intensity, FLOPs per byte read (compare with
    `Cluster.balance_point`)."""
    flops = batch * decode_flops_per_token(cfg, context, tp)
    return flops / decode_bytes_per_step(cfg, batch, context, bytes_per_value, tp)


def critical_batch(cluster: Cluster, bytes_per_value: int = 2) -> float:
    """The batch at which the weights' FLOPs take as long as reading them: 2BN/peak =
    N·w/bandwidth, B = balance point · w/2 (the Scaling Book's B_crit; the cache, read
    per sequence, never reaches it)."""
    return cluster.balance_point * bytes_per_value / 2


def max_decode_batch(cfg, cluster: Cluster, context: int, bytes_per_value: int = 2,
                     tp: int = 1) -> int:
    """Sequences of ``context`` positions whose caches fit beside a rank's weights in one
    GPU's memory (activations neglected): the cache, not the weights, sets the batch."""
    free = cluster.memory - weight_params_read(cfg, tp) * bytes_per_value
    per_sequence = context * kv_cache_bytes_per_token(cfg, bytes_per_value, tp)
    return max(0, int(free // per_sequence))


@dataclass(frozen=True)
class DecodeTime:
    """One decode step on one rank, a MODEL (seconds): the cache read, the weights' read
    and their FLOPs (the larger counts), the all-reduces."""

    batch: int
    tp: int
    cache_seconds: float
    weight_seconds: float
    compute_seconds: float
    comm_seconds: float
    allreduce: str = "ring"

    @property
    def seconds(self) -> float:
        return (self.cache_seconds + max(self.weight_seconds, self.compute_seconds)
                + self.comm_seconds)

    @property
    def tokens_per_second(self) -> float:
        return self.batch / self.seconds

    @property
    def bound(self) -> str:
        parts = {"memory": self.cache_seconds + self.weight_seconds,
                 "compute": self.compute_seconds, "communication": self.comm_seconds}
        return max(parts, key=parts.get)

    def __repr__(self) -> str:
        return (f"DecodeTime(model: B={self.batch}, tp={self.tp}, {self.allreduce} all-reduces: "
                f"{self.seconds * 1e3:.3f} ms a step, {self.tokens_per_second:,.0f} tokens/s, "
                f"{self.bound}-bound)")


def decode_step_time(cfg, cluster: Cluster, batch: int, context: int, tp: int = 1,
                     bytes_per_value: int = 2, allreduce: str = "ring") -> DecodeTime:
    """The modelled time of one decode step at ``batch`` sequences of ``context`` cached
    positions over ``tp`` ranks of one node, its all-reduces priced by ``allreduce``
    (``"ring"`` or ``"one_shot"``: `minitp.calc.network.allreduce`; see the module docstring)."""
    _check(batch=batch, context=context, tp=tp)
    bandwidth = cluster.memory_bandwidth
    if bandwidth is None:
        raise ValueError(f"{cluster.name}: no sourced HBM bandwidth to model decode with")
    cache = batch * context * kv_cache_bytes_per_token(cfg, bytes_per_value, tp)
    weights = weight_params_read(cfg, tp)
    activation = batch * cfg.d_model * bytes_per_value
    comm = 2 * cfg.n_layer * allreduce_time(cluster, activation, tp, allreduce).seconds
    return DecodeTime(batch, tp, cache / bandwidth, weights * bytes_per_value / bandwidth,
                      2 * batch * weights / cluster.peak_flops, comm, allreduce)


def decode_vs_tp(cfg, cluster: Cluster, batch: int, context: int,
                 tps=(1, 2, 4, 8), bytes_per_value: int = 2,
                 allreduce: str = "ring") -> list[DecodeTime]:
    """`decode_step_time` at each tp of ``tps`` (a model)."""
    return [decode_step_time(cfg, cluster, batch, context, tp, bytes_per_value, allreduce)
            for tp in tps]


def tp_stops_paying(cfg, cluster: Cluster, batch: int, context: int,
                    tps=(1, 2, 4, 8), bytes_per_value: int = 2, allreduce: str = "ring") -> int:
    """The tp of ``tps`` (ascending) after which the next one no longer shortens the
    modelled step: the all-reduces' cost has overtaken the reads it divides. The last of
    ``tps`` when every step shortens (it has not stopped paying within them)."""
    times = decode_vs_tp(cfg, cluster, batch, context, tps, bytes_per_value, allreduce)
    for here, there in zip(times, times[1:], strict=False):
        if there.seconds >= here.seconds:
            return here.tp
    return times[-1].tp
