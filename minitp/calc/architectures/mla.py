"""Multi-head latent attention (`minitp.model.mla`) in the calculator: its parameters, FLOPs,
activation bytes and tensor-parallel bytes per layer, a MODEL (arithmetic on the shapes).

DeepSeek's heads are not d_model/n_head wide (V3: 128 heads of 128 on d_model 7168), so these
functions take an `MLAShape`, not a GPTConfig; `MLAShape.of(cfg)` is minitp's (d_h =
d_model/n_head), where they equal the GPTConfig-based counts (`exact_param_count`,
`model_flops`: tests/model/test_mla_serving.py) and the trace's bytes.

Per layer, no biases (DeepSeek's and minitp's MLA have none), w bytes a value, the query
width n_h·(d_h + d_h^R), the value width n_h·d_h:

* parameters: split by heads over tp: W^UQ/W^QR (d_q'·n_h(d_h + d_h^R), d_q' = d_q or h
  without a query latent), W^UK/W^UV (d_c·2n_h·d_h), W^O (n_h·d_h·h); replicated on every tp
  rank: W^DQ (h·d_q), W^DKV (h·d_c), W^KR (h·d_h^R) and the two latents' RMSNorms (d_q + d_c);
* forward FLOPs a token at `context` keys, 2 a weight: expanded (training's form) 2·weights +
  2n_h(d_h + d_h^R)·context (QKᵀ) + 2n_h·d_h·context (·V); absorbed (decode's, V2 §2.1.2:
  no K or V is made, so W^UK/W^UV are not applied to the keys) 2·(weights − W^UK/W^UV) +
  2·2n_h·d_h·d_c (W^UKᵀ into the query, W^UV out of the core) + 2n_h(d_c + d_h^R)·context +
  2n_h·d_c·context: the core reads the latent, d_c wide, as its one K/V head;
* activations kept for backward (Korthikanti et al. 2022's accounting, 2-byte values, 1-byte
  masks: `minitp.calc.network.context_parallel.attention_kept_bytes` for GQA's): the
  latents' norms keep their inputs and the up-projections their outputs, 2sb(2d_q + 2d_c),
  whole on every tp rank and at the whole s even with sequence parallelism (they are made
  after SP's all-gather); Q and K 2sb·n_h(d_h + d_h^R)/t each, V 2sb·n_h·d_h/t; the
  probabilities and dropout 5·n_h·s²b/t; the rotary key reaches K through the rotation
  (kept as cos/sin tables, no term). Selective recomputation keeps no probabilities.
* tensor parallelism's bytes (`mla_tp_bytes_per_layer`): the layer's four activation
  collectives, GPT's (`tp_comm_bytes`: one mapped input for every projection), and one
  all-reduce of the replicated modules' gradients, partial on each rank (each rank's heads
  send back only their share): plus the block's two RMSNorms under sequence parallelism.

`DEEPSEEK_V3_MLA`: DeepSeek-V3's attention (arXiv 2412.19437, §4.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ...rules import ring_send_fraction
from .._util import number

__all__ = ["DEEPSEEK_V3_MLA", "MLAShape", "mla_activation_bytes_per_layer",
           "mla_cp_bytes_per_layer", "mla_flops_per_token", "mla_params",
           "mla_tp_bytes_per_layer"]


@dataclass(frozen=True)
class MLAShape:
    """One latent-attention layer's sizes (and the layers' count)."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    head_dim: int
    kv_lora_rank: int
    q_lora_rank: int
    rope_dim: int
    source: str = ""

    @classmethod
    def of(cls, cfg) -> MLAShape:
        """minitp's layer of a `GPTConfig.mla` config: heads d_model/n_head wide."""
        return cls("minitp", cfg.n_layer, cfg.d_model, cfg.n_head, cfg.head_dim,
                   cfg.kv_lora_rank, cfg.q_lora_rank, cfg.rope_dim, "GPTConfig.mla")


DEEPSEEK_V3_MLA = MLAShape(
    "DeepSeek-V3", n_layer=61, d_model=7168, n_head=128, head_dim=128, kv_lora_rank=512,
    q_lora_rank=1536, rope_dim=64,
    source="DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv 2412.19437), §4.2: 61 "
           "layers, hidden dimension 7168, 128 attention heads, per-head dimension d_h 128, "
           "KV compression dimension d_c 512, query compression dimension d_c' 1536, "
           "decoupled query/key per-head dimension d_h^R 64; equations in §2.1.1")


def _widths(shape: MLAShape) -> tuple[int, int]:
    """(the queries' and keys' width n_h(d_h + d_h^R), the values' n_h·d_h)."""
    return shape.n_head * (shape.head_dim + shape.rope_dim), shape.n_head * shape.head_dim


def mla_params(shape: MLAShape) -> dict:
    """MODEL: one layer's attention parameters: {"split": by heads over tp, "replicated": whole on
    every tp rank, "total"} (the module docstring)."""
    h, dq, dc, r = shape.d_model, shape.q_lora_rank, shape.kv_lora_rank, shape.rope_dim
    qk, v = _widths(shape)
    split = (dq or h) * qk + dc * 2 * v + v * h
    replicated = h * dq + dq + h * dc + dc + h * r
    return {"split": split, "replicated": replicated, "total": split + replicated}


def mla_flops_per_token(shape: MLAShape, context: int, form: str = "expanded") -> int:
    """MODEL: forward FLOPs of one layer's attention for one token attending `context` keys, in
    the "expanded" (training) or "absorbed" (decode) form (the module docstring)."""
    if form not in ("expanded", "absorbed"):
        raise ValueError(f"form must be 'expanded' or 'absorbed', got {form!r}")
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be a positive int, got {context!r}")
    qk, v = _widths(shape)
    dq, dc = shape.q_lora_rank, shape.kv_lora_rank
    weights = mla_params(shape)["total"] - dq - dc  # the norms are not matrices
    if form == "expanded":
        return 2 * weights + 2 * qk * context + 2 * v * context
    kv_up = dc * 2 * v
    return (2 * (weights - kv_up) + 2 * 2 * v * dc
            + 2 * shape.n_head * (dc + shape.rope_dim) * context
            + 2 * shape.n_head * dc * context)


def mla_activation_bytes_per_layer(shape: MLAShape, seq_len: int, micro_batch: int,
                                   tp: int = 1, recompute=None, cp: int = 1,
                                   cp_comm: str = "allgather") -> dict:
    """MODEL: bytes one tp rank's attention keeps for backward in one layer, by term:
    {"latents", "q", "k_and_v", "probabilities", "dropout"} (the module docstring; the
    layer's norms, inputs and W^O's input are GPT's: `activation_bytes_per_layer`).
    Context parallelism (cp > 1, minitp's "allgather" for latent attention,
    `minitp.context_parallel.latent`): each rank's s/c queries; the gathered latent (kv_up's
    input) and the keys and values made from it at the whole s; the probabilities s/c × s."""
    if cp > 1 and cp_comm != "allgather":
        raise ValueError(f"cp_comm={cp_comm!r}: latent attention runs context parallelism "
                         "by gathering its latent ('allgather') only")
    s, b, a, c = seq_len, micro_batch, shape.n_head, cp
    qk, v = _widths(shape)
    dq, dc, r = shape.q_lora_rank, shape.kv_lora_rank, shape.rope_dim
    latents = Fraction(2 * s * b * (2 * dq + dc), c) + 2 * s * b * dc  # kv_up reads all s
    if c > 1:  # the gathered rotary key too: the all-gather's output, kept for K
        latents += 2 * s * b * r
    scores = Fraction(0) if recompute == "selective" else Fraction(a * s * s * b, tp * c)
    return {"latents": latents, "q": Fraction(2 * s * b * qk, tp * c),
            "k_and_v": Fraction(2 * s * b * (qk + v), tp), "probabilities": 2 * scores,
            "dropout": 3 * scores}


def mla_tp_bytes_per_layer(shape: MLAShape, seq_len: int, micro_batch: int, tp: int,
                           sp: bool = False, bytes_per_value: int = 2) -> dict:
    """MODEL: what one layer of latent attention and its MLP put through tensor parallelism's
    collectives (full tensors, the trace's ``nbytes``): {"activations": per microbatch, the
    four places' b·s·h·w each (an all-reduce each; with SP an all-gather and a
    reduce-scatter each), "partial_grads": per step, the replicated modules' gradients
    (the two block norms' added under SP), "sent_activations", "sent_grads": the ring
    MODEL's bytes one rank sends for each}. minitp sums every layer's partial gradients in
    one flattened all-reduce a step (`minitp.tensor_parallel.partial_grads`): this is one
    layer's share of it."""
    w, h = bytes_per_value, shape.d_model
    activations = 4 * micro_batch * seq_len * h * w
    grads = (mla_params(shape)["replicated"] + (2 * h if sp else 0)) * w
    per = ring_send_fraction("all_reduce", tp)  # a place's all-gather + reduce-scatter too
    return {"activations": activations, "partial_grads": grads,
            "sent_activations": number(activations * per), "sent_grads": number(grads * per)}


def mla_cp_bytes_per_layer(shape: MLAShape, seq_len: int, micro_batch: int, tp: int = 1,
                           bytes_per_value: int = 2) -> dict:
    """MODEL: context parallelism's tensors in one layer of latent attention, per microbatch, full
    sizes (the trace's ``nbytes``): {"latent": the gathered latent and rotary key,
    (d_c + d_h^R)·b·s·w, all-gathered forward and reduce-scattered backward (the same
    size; `minitp.context_parallel.latent`), "heads": what gathering each tp rank's heads'
    K and V would move instead, n_h/t·(2d_h + d_h^R)·b·s·w}."""
    token = micro_batch * seq_len * bytes_per_value
    heads = shape.n_head // tp * (2 * shape.head_dim + shape.rope_dim)
    return {"latent": (shape.kv_lora_rank + shape.rope_dim) * token, "heads": heads * token}
