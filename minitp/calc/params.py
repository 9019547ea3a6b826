"""Parameter counts: the whole GPT, and what one rank holds under (tp, pp).

Symbols as in Narayanan et al. 2021 (arXiv 2104.04473): l layers, h hidden
size, V vocabulary, s sequence length. Every count here is an exact integer.
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
    """
    V, s, L, h = cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.d_model
    if cfg.bias:
        return param_count(cfg) + 2 * h
    return 12 * L * h * h + 2 * L * h + (V + s) * h + h


def padded_vocab(vocab_size: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp, as `VocabParallelEmbedding`
    pads it (Megatron-LM pads to a multiple of 128·t by default)."""
    return round_up(vocab_size, tp)


def layer_params_per_rank(cfg, tp: int = 1) -> int:
    """One transformer layer on one tensor-parallel rank: 12h²/t + 7h/t + 6h.

    Split over t: the four weight matrices (12h²) and the biases of the column-
    parallel layers (qkv 3h, fc 4h). Whole on every rank: the row-parallel
    biases (2h) and both LayerNorms (4h). Without biases: 12h²/t + 2h.
    """
    h = cfg.d_model
    if cfg.bias:
        return (12 * h * h + 7 * h) // tp + 6 * h
    return 12 * h * h // tp + 2 * h


def params_per_stage(cfg, tp: int = 1, pp: int = 1) -> list[int]:
    """Parameters on one rank of each pipeline stage, first to last.

    Layers are split evenly (l/p per stage). The first stage also holds the
    token embedding (its V'/t rows, V' = `padded_vocab`) and the position
    embedding (sh, whole on every TP rank); the last stage the final LayerNorm
    and the output layer. The output layer is tied to the token embedding: with
    p > 1, as in Megatron-LM, the last stage keeps its own copy of it (V'h/t
    more), and the two copies' gradients are summed every step. With p = 1 it
    is one tensor, counted once.
    """
    check_parallel_config(cfg, tp=tp, pp=pp)
    h = cfg.d_model
    embedding = padded_vocab(cfg.vocab_size, tp) * h // tp
    final_norm = 2 * h if cfg.bias else h
    stages = [cfg.n_layer // pp * layer_params_per_rank(cfg, tp)] * pp
    stages[0] += embedding + cfg.seq_len * h
    stages[-1] += final_norm + (embedding if pp > 1 else 0)
    return stages


def params_per_rank(cfg, tp: int = 1, pp: int = 1, stage: int | None = None) -> int:
    """Parameters one rank holds: of pipeline stage ``stage``, or, by default, of
    the stage that holds the most (the one whose memory limits the run)."""
    stages = params_per_stage(cfg, tp, pp)
    return max(stages) if stage is None else stages[stage]
