"""Parameter counts: the whole GPT, and what one rank holds under (tp, pp).

Symbols as in Narayanan et al. 2021 (arXiv 2104.04473): l layers, h hidden
size, V vocabulary, s sequence length. Every count here is an exact integer.

A mixture of experts (``cfg.n_experts`` = E > 0) changes the layers ``cfg.is_moe_layer``
picks: their MLP becomes a router (h×E, no bias), E expert MLPs (h→4h→h, biases with
``cfg.bias``) and, with ``cfg.shared_expert``, one more dense MLP. minitp splits the
shared expert over tp like a dense MLP, but not the router nor the routed experts
(whole on every tp rank); expert parallelism (ep) gives a rank E/ep of the experts
(`minitp.expert_parallel`). `minitp.calc.moe` counts total and active parameters.
"""

from __future__ import annotations

from ..rules import check_parallel_config, round_up


def param_count(cfg) -> int:
    """Narayanan et al. 2021, Eq. 2: P = 12lh²(1 + 13/(12h) + (V + s)/(12lh)).

    Multiplied out: 12lh² (four weight matrices, h×3h + h×h + h×4h + 4h×h) +
    13lh (per layer: 9h of biases and two LayerNorms of 2h) + (V + s)h (token
    and position embeddings; the output layer is tied to the token embedding).
    It has no final LayerNorm: see `exact_param_count`.
    """
    V, s, L, h = cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.d_model
    return 12 * L * h * h + 13 * L * h + (V + s) * h


def exact_param_count(cfg) -> int:
    """Parameters of minitp's own `GPT(cfg)`: Eq. 2 plus the final LayerNorm's 2h.

    With ``cfg.bias=False`` the layers have no biases and the LayerNorms no
    shift: 2h per layer (two LayerNorm scales) instead of 13h, and h for ln_f.
    A mixture of experts: every layer counted as `layer_params_per_rank` counts it.
    """
    if _moe(cfg):
        return params_per_stage(cfg)[0]
    V, s, L, h = cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.d_model
    if cfg.bias:
        return param_count(cfg) + 2 * h
    return 12 * L * h * h + 2 * L * h + (V + s) * h + h


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

    Layer ``index`` of a mixture of experts, where ``cfg.is_moe_layer(index)``:
    attention and LayerNorms as above, (4h² + 3h)/t + 5h (no bias: 4h²/t + 2h), the
    router hE, the shared expert (8h² + 4h)/t + h if any, and E/ep whole experts.
    """
    h = cfg.d_model
    if _moe(cfg) and index is None:
        raise ValueError("a mixture of experts' layers differ: give the layer's index")
    if _moe(cfg) and cfg.is_moe_layer(index):
        shared = ((8 * h * h + 4 * h) // tp + h if cfg.bias else 8 * h * h // tp)
        attention = (4 * h * h + 3 * h) // tp + 5 * h if cfg.bias else 4 * h * h // tp + 2 * h
        return (attention + h * cfg.n_experts + shared * cfg.shared_expert
                + expert_params_per_layer(cfg, ep))
    if cfg.bias:
        return (12 * h * h + 7 * h) // tp + 6 * h
    return 12 * h * h // tp + 2 * h


def params_per_stage(cfg, tp: int = 1, pp: int = 1, ep: int = 1) -> list[int]:
    """Parameters on one rank of each pipeline stage, first to last.

    Layers are split evenly (l/p per stage). The first stage also holds the
    token embedding (its V'/t rows, V' = `padded_vocab`) and the position
    embedding (sh, whole on every TP rank); the last stage the final LayerNorm
    and the output layer. The output layer is tied to the token embedding: with
    p > 1, as in Megatron-LM, the last stage keeps its own copy of it (V'h/t
    more), and the two copies' gradients are summed every step. With p = 1 it
    is one tensor, counted once. ``ep``: a mixture of experts' experts shared out
    over ep ranks (E/ep per MoE layer on each).
    """
    check_parallel_config(cfg, tp=tp, pp=pp)
    h = cfg.d_model
    embedding = padded_vocab(cfg.vocab_size, tp) * h // tp
    final_norm = 2 * h if cfg.bias else h
    per = cfg.n_layer // pp
    if _moe(cfg):
        stages = [sum(layer_params_per_rank(cfg, tp, i, ep) for i in range(k * per, (k + 1) * per))
                  for k in range(pp)]
    else:
        stages = [per * layer_params_per_rank(cfg, tp)] * pp
    stages[0] += embedding + cfg.seq_len * h
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
