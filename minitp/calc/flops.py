"""FLOPs per iteration, utilisation, the pipeline bubble, and training time.

B global batch (sequences), s sequence length, l layers, h hidden size, V
vocabulary. A matrix multiply of (m×k)·(k×n) costs 2mkn FLOPs; a backward pass
twice its forward.
"""

from __future__ import annotations

from fractions import Fraction

from ..rules import check_recompute
from ._util import number


def flops_per_iteration(cfg, global_batch: int, recompute=None) -> int:
    """FLOPs the GPUs execute for one iteration of ``global_batch`` sequences.

    One layer's forward is 24Bsh² (the four weight matrices) + 4Bs²h (QKᵀ and
    ·V); the output layer's 2BshV. Forward + backward is 3× the forward:

    * ``None``: Korthikanti et al. 2022, Appendix A, Eq. 7 ("model FLOPs"),
      72Bslh²(1 + s/(6h) + V/(12lh));
    * ``"selective"``: their Eq. 8 ("hardware FLOPs"), 72Bslh²(1 + s/(3h) +
      V/(12lh)), as printed: it reproduces their Table 5 HFU. (Counting only the
      recomputed QKᵀ and ·V, 4Bs²h per layer, would give 2s/(9h) in place of s/(3h).)
    * ``"full"``: every layer's forward runs twice, 4× in all; the output layer
      is not recomputed: Narayanan et al. 2021, Eq. 3, 96Bslh²(1 + s/(6h) + V/(16lh)).

    minitp's GPT runs exactly Eq. 7's FLOPs (torch's FLOP counter agrees). Its
    recomputation runs less than the papers': torch's checkpoint stops once
    backward has what it needs, so full recomputation skips each layer's last
    matmul (8Bsh²) and selective recomputation redoes QKᵀ only (2Bs²h).

    A mixture of experts counts the matrices a token uses (its active parameters): an
    MoE layer's forward is 8Bsh² (attention) + 16Bsh²·(k + 1 if a shared expert) + 2BshE
    (the router) in place of 24Bsh² — dropless routing, every token's k assignments
    run (a capacity factor that drops some runs fewer; not modelled).
    """
    check_recompute(recompute)
    B, s, L, h, V = global_batch, cfg.seq_len, cfg.n_layer, cfg.d_model, cfg.vocab_size
    passes = 4 if recompute == "full" else 3  # forward passes' worth of the layers
    if getattr(cfg, "n_experts", 0):
        matrices = passes * B * s * layer_matrix_flops(cfg)
    else:
        matrices = passes * 24 * B * s * L * h * h
    attention = {None: 12, "selective": 24, "full": 16}[recompute] * B * L * s * s * h
    output_layer = 3 * 2 * B * s * h * V
    return matrices + attention + output_layer


def layer_matrix_flops(cfg, experts_only: bool = False) -> int:
    """Forward FLOPs per token of every layer's weight matrices: 24h² a dense layer;
    an MoE layer 8h² + 16h²·(k + shared) + 2hE. ``experts_only``: the routed experts'
    16h²·k per MoE layer alone."""
    h, total = cfg.d_model, 0
    for i in range(cfg.n_layer):
        if not cfg.is_moe_layer(i):
            total += 0 if experts_only else 24 * h * h
        elif experts_only:
            total += 16 * h * h * cfg.top_k
        else:
            total += (8 * h * h + 16 * h * h * (cfg.top_k + cfg.shared_expert)
                      + 2 * h * cfg.n_experts)
    return total


def model_flops(cfg, global_batch: int) -> int:
    """The FLOPs the model needs, recomputation not counted (Korthikanti Eq. 7):
    the numerator of model FLOPs utilisation (MFU)."""
    return flops_per_iteration(cfg, global_batch, recompute=None)


def mfu(flops: float, seconds: float, n_gpus: int, peak: float) -> float:
    """Achieved over peak: flops / (seconds · n_gpus · peak FLOP/s per GPU).

    With `model_flops` this is MFU (as Korthikanti et al. 2022 define it); with the
    FLOPs actually executed (`flops_per_iteration` with recomputation) it is
    their HFU, and Narayanan et al.'s "% of theoretical peak".
    """
    return flops / (seconds * n_gpus * peak)


def bubble(pp: int, microbatches: int, virtual: int = 1) -> int | float:
    """Pipeline bubble as a fraction of the ideal compute time: (p − 1)/(v·m).

    Narayanan et al. 2021, §2.2.1 (GPipe and 1F1B: (p − 1)/m) and §2.2.2
    (interleaved, v model chunks per GPU: (p − 1)/(v·m)).
    """
    return number(Fraction(pp - 1, virtual * microbatches))


def training_seconds(tokens: float, n_params: float, n_gpus: int, flops_per_gpu: float) -> float:
    """End-to-end training time ≈ 8TP/(nX): Narayanan et al. 2021, Eq. 4
    (T tokens, P parameters, n GPUs, X achieved FLOP/s per GPU; Eq. 3 with
    6h ≫ s and 16lh ≫ V, i.e. ≈ 8 FLOPs per parameter per token with recomputation)."""
    return 8 * tokens * n_params / (n_gpus * flops_per_gpu)
