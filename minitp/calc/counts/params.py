"""Parameter counts: the whole GPT, and what one rank holds under (tp, pp).

Symbols as in Narayanan et al. 2021 (arXiv 2104.04473): l layers, h hidden
size, V vocabulary, s sequence length. Every count here is an exact integer.

The layer's parts follow the configuration (`minitp.GPTConfig`; GPT-2's when a shape has
no such field): LayerNorm (weight, and a shift with ``cfg.bias``) or RMSNorm (weight only,
Zhang and Sennrich 2019); learned positions (sh) or rotary ones (none: Su et al. 2021);
one fused qkv projection h→3h or, with ``n_kv_head`` = K, q (h→h) and kv (h→2K·d, d the
head dimension: grouped-query attention, Ainslie et al. 2023); a GELU MLP h→f→h or a
SwiGLU one, fc h→2f (gate and up) and proj f→h (Shazeer 2020), f = ``cfg.ffn_width``
(4h; a SwiGLU 8h/3 rounded up to 16, as Touvron et al. 2023). Under tp the q, kv, qkv
and fc weights (and biases) are column-split, attn.proj and mlp.proj row-split (their
biases whole), the norms whole; kv is split by K/V head where tp divides K and whole on
every rank where tp exceeds K (`minitp.rules.heads.kv_layout`: "replicated").

A mixture of experts (``cfg.n_experts`` = E > 0) changes the layers ``cfg.is_moe_layer``
picks: their MLP becomes a router (h×E, no bias), E expert MLPs (h→4h→h, biases with
``cfg.bias``) and, with ``cfg.shared_expert``, one more dense MLP. minitp splits the
shared expert over tp like a dense MLP, but not the router nor the routed experts
(whole on every tp rank); expert parallelism (ep) gives a rank E/ep of the experts
(`minitp.expert_parallel`). `minitp.calc.architectures.moe` counts total and active parameters.
"""

from __future__ import annotations

from fractions import Fraction

from ...rules import PATCH_H, PATCH_W, check_parallel_config, kv_layout, round_up
from .._util import number


# --------------------------------------------------------------------------- the layer's parts
# Read with GPT-2's defaults, so that a bare shape (a SimpleNamespace with the sizes, as the
# lessons' questions pass) is a GPT-2 layer.
def ffn_width(cfg) -> int:
    """The MLP's hidden width f: ``cfg.ffn_width``, 4h for a shape without one."""
    return getattr(cfg, "ffn_width", 4 * cfg.d_model)


def swiglu(cfg) -> bool:
    """Whether the MLP is a SwiGLU (Shazeer 2020): gate and up, three h×f matrices."""
    return getattr(cfg, "mlp", "gelu") == "swiglu"


def grouped(cfg) -> bool:
    """Whether attention has separate q and kv projections (``n_kv_head`` set)."""
    return getattr(cfg, "n_kv_head", None) is not None


def kv_width(cfg) -> int:
    """The kv projection's output features, 2·K·d (K/V heads times head dimension)."""
    return 2 * cfg.kv_heads * cfg.head_dim


def learned_positions(cfg) -> bool:
    return getattr(cfg, "positions", "learned") == "learned"


def norm_params(cfg) -> int:
    """One norm: LayerNorm h weights (+ h shift with ``cfg.bias``), RMSNorm h weights."""
    if getattr(cfg, "norm", "layernorm") == "rmsnorm":
        return cfg.d_model
    return 2 * cfg.d_model if cfg.bias else cfg.d_model


def gpt2_layer(cfg) -> bool:
    """Whether the layer is Narayanan et al.'s: fused qkv, GELU MLP 4h wide, LayerNorm,
    learned positions (biases or not)."""
    return (not grouped(cfg) and not swiglu(cfg) and ffn_width(cfg) == 4 * cfg.d_model
            and getattr(cfg, "norm", "layernorm") == "layernorm" and learned_positions(cfg))


def latent(cfg) -> bool:
    """Whether attention is multi-head latent attention (``kv_lora_rank`` set: `GPTConfig.mla`)."""
    return getattr(cfg, "kv_lora_rank", 0) > 0


def _latent_split(cfg) -> tuple[int, int]:
    """Latent attention's parameters (`minitp.model.mla`): (split by heads: W^UQ/W^QR, W^UK/W^UV
    with their biases and W^O's weight; whole on every tp rank: W^DQ, W^DKV, their RMSNorms,
    W^KR and W^O's bias). Its weights: d_q'·n_h(d_h + d_r) + 2h·d_c + h² + h·d_q + h·d_c + h·d_r
    (d_q' = d_q, or h without a query latent)."""
    h, b, r, dc, dq = cfg.d_model, cfg.bias, cfg.rope_dim, cfg.kv_lora_rank, cfg.q_lora_rank
    q_width = cfg.n_head * (cfg.head_dim + r)
    split = (dq or h) * q_width + dc * 2 * h + h * h + b * (q_width + 2 * h)
    whole = (h * dq + b * dq + dq) + (h * dc + b * dc + dc) + (h * r + b * r) + b * h
    return split, whole


def attention_weights(cfg) -> int:
    """Attention's weight matrices: 4h² fused (h×3h + h×h); grouped q, kv and proj,
    2h² + 2K·d·h (Ainslie et al. 2023: the kv projection is K/n_head of GPT-2's k and v);
    latent attention's, `_latent_split`'s."""
    h = cfg.d_model
    if latent(cfg):
        dq, dc, r = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.rope_dim
        return ((dq or h) * cfg.n_head * (cfg.head_dim + r) + 2 * h * dc + h * h
                + h * dq + h * dc + h * r)
    return 2 * h * h + (kv_width(cfg) * h if grouped(cfg) else 2 * h * h)


def mlp_weights(cfg) -> int:
    """The dense MLP's weight matrices: 2hf (GELU: fc, proj), 3hf (SwiGLU: gate, up, proj)."""
    return (3 if swiglu(cfg) else 2) * cfg.d_model * ffn_width(cfg)


def _attention_split(cfg, tp: int) -> tuple[int, int]:
    """Attention's parameters on a tp rank: (split over tp, whole on each rank).

    Split: the column-parallel qkv (or q, and kv when tp divides the K/V heads) with their
    biases and the row-parallel proj's weight; whole: proj's bias (added after the
    all-reduce) and a replicated kv (tp above the K/V heads: `ReplicatedKV`)."""
    if latent(cfg):
        return _latent_split(cfg)
    h, bias = cfg.d_model, cfg.bias
    split, whole = h * h, h if bias else 0  # proj: weight split by rows, bias whole
    if not grouped(cfg):
        return split + 3 * h * h + (3 * h if bias else 0), whole
    split += h * h + (h if bias else 0)  # q
    kv = kv_width(cfg) * h + (kv_width(cfg) if bias else 0)
    if kv_layout(cfg, tp) == "split":
        return split + kv, whole
    return split, whole + kv


def _mlp_split(cfg) -> tuple[int, int]:
    """The dense MLP's parameters on a tp rank: (split: fc's weight and bias, proj's
    weight; whole: proj's bias)."""
    fc_out = (2 if swiglu(cfg) else 1) * ffn_width(cfg)
    bias = cfg.bias
    return mlp_weights(cfg) + (fc_out if bias else 0), cfg.d_model if bias else 0


def param_count(cfg) -> int:
    """Narayanan et al. 2021, Eq. 2: P = 12lh²(1 + 13/(12h) + (V + s)/(12lh)).

    Multiplied out: 12lh² (four weight matrices, h×3h + h×h + h×4h + 4h×h) +
    13lh (per layer: 9h of biases and two LayerNorms of 2h) + (V + s)h (token
    and position embeddings; the output layer is tied to the token embedding).
    It has no final LayerNorm: see `exact_param_count`. Eq. 2 is printed for GPT-2's
    layer (`gpt2_layer`) and is returned as printed for it, whatever ``cfg.bias``.

    Any other layer (RMSNorm, rotary positions, SwiGLU, grouped-query attention, an MLP
    not 4h wide): Eq. 2 generalized, its same terms counted for the parts the config has
    — l layers as `layer_params_per_rank` counts them + Vh (+ sh for learned positions),
    no final norm — i.e. `exact_param_count` less the final norm.
    """
    V, s, L, h = cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.d_model
    if gpt2_layer(cfg):
        return 12 * L * h * h + 13 * L * h + (V + s) * h
    return exact_param_count(cfg) - norm_params(cfg)


def exact_param_count(cfg) -> int:
    """Parameters of minitp's own `GPT(cfg)`: l layers, the token embedding Vh, learned
    positions' sh, the final norm — for GPT-2's layer with biases Eq. 2 plus ln_f's 2h.

    With ``cfg.bias=False`` the layers have no biases and the LayerNorms no
    shift: 2h per layer (two LayerNorm scales) instead of 13h, and h for ln_f.
    A Llama-style layer (no biases, RMSNorm, K/V heads K, SwiGLU f wide, rotary):
    l(2h² + 2Kdh + 3hf + 2h) + Vh + h. Each layer as `layer_params_per_rank` counts it.
    """
    if _moe(cfg):
        return params_per_stage(cfg)[0]
    V, s, L, h = cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.d_model
    positions = s * h if learned_positions(cfg) else 0
    return (L * layer_params_per_rank(cfg) + V * h + positions + norm_params(cfg)
            + vision_params(cfg))


def vision_params(cfg) -> int:
    """A vision-language model's encoder and projector, whole; 0 for a text model."""
    if not getattr(cfg, "vision_patches", 0):
        return 0
    return number(encoder_params(cfg.vision_layers, Fraction(cfg.vision_width),
                                 cfg.vision_patches, cfg.d_model))


def encoder_params(layers: int, width, patches: int, d_model: int, split: int = 1):
    """A vision encoder's parameters on one rank (`minitp.model.vision`;
    `minitp.calc.architectures.vision`'s layouts): L(12w² + 7w)/split in its blocks'
    matrices and column-parallel biases (split over tp in the "tensor" layout), the rest
    whole — 6Lw (row-parallel biases, two LayerNorms a block), the patch embedding 8w + w,
    positions Pw, the final LayerNorm 2w, the projector wd + d. `width` may be a Fraction or a
    float (`vision_crossover`)."""
    L, w, P, d = layers, width, patches, d_model
    return (L * (12 * w * w + 7 * w) / split + 6 * L * w + (PATCH_W * PATCH_H + 1 + P + 2) * w
            + w * d + d)


def padded_vocab(vocab_size: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp, as `VocabParallelEmbedding`
    pads it (Megatron-LM pads to a multiple of 128·t by default)."""
    return round_up(vocab_size, tp)


def _moe(cfg) -> bool:
    return getattr(cfg, "n_experts", 0) > 0


def expert_mlp_params(cfg) -> int:
    """One expert MLP (h → 4h → h): 8h² weights, 5h biases with ``cfg.bias``."""
    h = cfg.d_model
    return 8 * h * h + (5 * h if cfg.bias else 0)


def expert_params_per_layer(cfg, ep: int = 1) -> int:
    """The routed experts of one MoE layer on one expert-parallel rank: E/ep MLPs."""
    return cfg.n_experts // ep * expert_mlp_params(cfg)


def layer_params_per_rank(cfg, tp: int = 1, index: int | None = None, ep: int = 1) -> int:
    """One transformer layer on one tensor-parallel rank: 12h²/t + 7h/t + 6h.

    Split over t: the four weight matrices (12h²) and the biases of the column-
    parallel layers (qkv 3h, fc 4h). Whole on every rank: the row-parallel
    biases (2h) and both LayerNorms (4h). Without biases: 12h²/t + 2h.

    Other parts (see the module docstring): split (2h² + 3hf + 2Kdh)/t, whole the two
    RMSNorms' 2h, for a Llama layer whose t divides K; where t exceeds K the kv
    projection is whole on every rank: (2h² + 3hf)/t + 2Kdh + 2h. With biases, q's h,
    kv's 2Kd and fc's f (GELU) or 2f (SwiGLU) go with their weights, the row-parallel
    biases (2h) are whole.

    Layer ``index`` of a mixture of experts, where ``cfg.is_moe_layer(index)``:
    attention and norms as above (GPT-2's: (4h² + 3h)/t + 5h, no bias: 4h²/t + 2h), the
    router hE, the shared expert (8h² + 4h)/t + h if any, and E/ep whole experts.
    """
    h = cfg.d_model
    if _moe(cfg) and index is None:
        raise ValueError("a mixture of experts' layers differ: give the layer's index")
    split, whole = _attention_split(cfg, tp)
    whole += 2 * norm_params(cfg)
    if _moe(cfg) and cfg.is_moe_layer(index):
        shared = ((8 * h * h + 4 * h) // tp + h if cfg.bias else 8 * h * h // tp)
        return (split // tp + whole + h * cfg.n_experts + shared * cfg.shared_expert
                + expert_params_per_layer(cfg, ep))
    mlp_split, mlp_whole = _mlp_split(cfg)
    return (split + mlp_split) // tp + whole + mlp_whole


def params_per_stage(cfg, tp: int = 1, pp: int = 1, ep: int = 1) -> list[int]:
    """Parameters on one rank of each pipeline stage, first to last.

    Layers are split evenly (l/p per stage). The first stage also holds the
    token embedding (its V'/t rows, V' = `padded_vocab`) and the position
    embedding (sh, whole on every TP rank); the last stage the final LayerNorm
    and the output layer (rotary positions have none). The output layer is tied
    to the token embedding: with p > 1, as in Megatron-LM, the last stage keeps its
    own copy of it (V'h/t more), and the two copies' gradients are summed every
    step. With p = 1 it is one tensor, counted once. ``ep``: a mixture of experts'
    experts shared out over ep ranks (E/ep per MoE layer on each). A vision-language
    model's encoder sits on the first stage, counted whole (replicated over tp, its
    default: the split layout holds less, `minitp.calc.architectures.vision.vision_layout`).
    """
    check_parallel_config(cfg, tp=tp, pp=pp)
    h = cfg.d_model
    embedding = padded_vocab(cfg.vocab_size, tp) * h // tp
    final_norm = norm_params(cfg)
    per = cfg.n_layer // pp
    if _moe(cfg):
        stages = [sum(layer_params_per_rank(cfg, tp, i, ep) for i in range(k * per, (k + 1) * per))
                  for k in range(pp)]
    else:
        stages = [per * layer_params_per_rank(cfg, tp)] * pp
    stages[0] += (embedding + (cfg.seq_len * h if learned_positions(cfg) else 0)
                  + vision_params(cfg))
    stages[-1] += final_norm + (embedding if pp > 1 else 0)
    return stages


def params_per_rank(cfg, tp: int = 1, pp: int = 1, stage: int | None = None,
                    ep: int = 1) -> int:
    """Parameters one rank holds: of pipeline stage ``stage``, or, by default, of
    the stage that holds the most (the one whose memory limits the run)."""
    stages = params_per_stage(cfg, tp, pp, ep)
    return max(stages) if stage is None else stages[stage]


def expert_params_per_stage(cfg, pp: int = 1, ep: int = 1) -> list[int]:
    """The routed experts' parameters on one rank of each pipeline stage (0 for a
    dense config): E/ep experts per MoE layer of the stage, whole over tp."""
    if not _moe(cfg):
        return [0] * pp
    per = cfg.n_layer // pp
    return [sum(cfg.is_moe_layer(i) for i in range(k * per, (k + 1) * per))
            * expert_params_per_layer(cfg, ep) for k in range(pp)]
