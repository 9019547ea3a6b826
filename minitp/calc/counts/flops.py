"""FLOPs per iteration, utilisation, the pipeline bubble, and training time.

B global batch (sequences), s sequence length, l layers, h hidden size, V
vocabulary. A matrix multiply of (m×k)·(k×n) costs 2mkn FLOPs; a backward pass
twice its forward.
"""

from __future__ import annotations

from fractions import Fraction

from ...rules import (
    SCHEDULE_NAMES,
    V_SCHEDULES,
    check_recompute,
    check_schedule,
    check_zero_bubble,
    default_schedule,
    placement_of,
)
from .._util import number
from ..architectures.vision import vision_forward_flops
from .params import attention_weights, latent, mlp_weights


def flops_per_iteration(cfg, global_batch: int, recompute=None, causal: bool = False,
                        doc_lengths=None) -> int:
    """FLOPs the GPUs execute for one iteration of ``global_batch`` sequences.

    Two conventions for the core attention (QKᵀ and ·V), the only term that is not a
    weight matrix's. The defaults count every row's full s × s scores, as Korthikanti
    et al.'s Eq. 7 and 8 and Narayanan et al.'s Eq. 3 do, whatever ``cfg.causal``; every
    number the course prints uses them, and they stay the defaults so none changes:

    * ``causal=True`` halves the core term exactly (s²/2 per row, not s(s+1)/2): the
      scores a causal mask leaves, as Megatron-LM counts them
      (``megatron/training/training.py``, ``num_floating_point_operations``: "causal
      mask (only half of the mask is non-zero)") and so as Megatron-Bridge's published
      "Model TFLOP/s" does (`minitp.calc.accuracy`);
    * ``doc_lengths``: packed documents that attend only within themselves. The core
      term counts Σ Lᵢ² per row in place of s² (halved too when ``causal``). Either one
      row's lengths (every row packed alike) or one list per row (``global_batch`` of
      them); each row's lengths are positive and sum to ``cfg.seq_len``. A row of one
      document is the unpacked count.

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

    The Llama-style parts change only the weight matrices (`layer_matrix_flops`): a
    layer's forward is 2Bs·(its weights), 2Bs(2h² + 2Kdh + 3hf) for grouped-query
    attention (K/V heads K, d = h/a) and a SwiGLU f wide. QKᵀ and ·V stay 4Bs²h: the
    core repeats the K/V heads to all a query heads (grouped-query attention, Ainslie
    et al. 2023, saves the kv projection's FLOPs and the K/V cache, not these).
    A vision-language model (`GPTConfig.vlm`) adds its encoder's, 3× its forward
    (`minitp.calc.architectures.vision.vision_forward_flops`; the decoder counts the image positions
    with the text's).

    Latent attention (`GPTConfig.mla`): its weights as `attention_weights` counts them, and
    QKᵀ 2s²·n_h(d_h + d_r), ·V 2s²h (the expanded form, which training runs).

    RMSNorm, the rotary rotation (Su et al. 2021), silu and the gate's product are
    elementwise, not matrix FLOPs: not counted, as Eq. 7 leaves out GELU, softmax and
    LayerNorm. Selective recomputation stays Eq. 8's s/(3h) term; with full
    recomputation the last matmul minitp skips is mlp.proj's, 2Bsfh.
    """
    check_recompute(recompute)
    B, s, L, h, V = global_batch, cfg.seq_len, cfg.n_layer, cfg.d_model, cfg.vocab_size
    passes = 4 if recompute == "full" else 3  # forward passes' worth of the layers
    matrices = passes * B * s * layer_matrix_flops(cfg)
    scores = _scores_per_batch(global_batch, s, doc_lengths)  # Σ over rows of s² or Σ Lᵢ²
    width = _core_width(cfg)
    attention = {None: 12, "selective": 24, "full": 16}[recompute] * L * scores * width
    if causal:  # every coefficient above is even: the half is an exact integer
        attention //= 2
    output_layer = 3 * 2 * B * s * h * V
    # a VLM's encoder (`minitp.calc.architectures.vision`)
    vision = 3 * vision_forward_flops(cfg, B)
    return matrices + attention + output_layer + vision


def _scores_per_batch(global_batch: int, seq_len: int, doc_lengths) -> int:
    """Σ over the batch's rows of each row's attention scores: s² unpacked, Σ Lᵢ² packed."""
    if doc_lengths is None:
        return global_batch * seq_len * seq_len
    rows = list(doc_lengths)
    if rows and not isinstance(rows[0], int):  # one list of lengths per row
        if len(rows) != global_batch:
            raise ValueError(f"doc_lengths has {len(rows)} rows for global_batch={global_batch}")
    else:
        rows = [rows] * global_batch
    for row in rows:
        if not row or sum(row) != seq_len or min(row) < 1:
            raise ValueError(f"doc_lengths {list(row)} must be positive and sum to "
                             f"seq_len={seq_len}")
    return sum(length * length for row in rows for length in row)


def layer_matrix_flops(cfg, experts_only: bool = False) -> int:
    """Forward FLOPs per token of every layer's weight matrices, 2 per weight (a
    (1×k)·(k×n) product is 2kn): 24h² a dense GPT-2 layer; an MoE layer 8h² +
    16h²·(k + shared) + 2hE. ``experts_only``: the routed experts' 16h²·k per MoE
    layer alone.

    Other parts (`minitp.calc.counts.params.attention_weights`, `mlp_weights`): attention
    2·(2h² + 2Kdh) with separate q and kv (the kv projection is 2Kd wide, K/V heads K,
    d = h/a: Ainslie et al. 2023), 8h² fused; the MLP 2·3hf for a SwiGLU (gate and up
    h×f each, proj f×h: Shazeer 2020), 2·2hf for GELU (f = 4h: 16h²). A Llama layer:
    4h² + 4Kdh + 6hf (Touvron et al. 2023's 8h/3-wide SwiGLU: 16h², GELU's at 4h)."""
    total = 0
    attention = 2 * attention_weights(cfg)
    for i in range(cfg.n_layer):
        if not _is_moe_layer(cfg, i):
            total += 0 if experts_only else attention + 2 * mlp_weights(cfg)
        elif experts_only:
            total += 16 * cfg.d_model ** 2 * cfg.top_k
        else:
            h = cfg.d_model
            total += (attention + 16 * h * h * (cfg.top_k + cfg.shared_expert)
                      + 2 * h * cfg.n_experts)
    return total


def _core_width(cfg) -> int:
    """The mean of QKᵀ's and ·V's widths over the heads: h; latent attention's queries
    and keys are n_h(d_h + d_r) wide (the rotary part added), its values h."""
    if not latent(cfg):
        return cfg.d_model
    return (cfg.n_head * (cfg.head_dim + cfg.rope_dim) + cfg.d_model) // 2


def _is_moe_layer(cfg, index: int) -> bool:
    return getattr(cfg, "n_experts", 0) > 0 and cfg.is_moe_layer(index)


def model_flops(cfg, global_batch: int, causal: bool = False, doc_lengths=None) -> int:
    """The FLOPs the model needs, recomputation not counted (Korthikanti Eq. 7):
    the numerator of model FLOPs utilisation (MFU). The defaults count full attention;
    ``causal`` and ``doc_lengths`` are `flops_per_iteration`'s conventions (Megatron's
    MFU is ``causal=True``'s): an MFU should say which it used."""
    return flops_per_iteration(cfg, global_batch, recompute=None, causal=causal,
                               doc_lengths=doc_lengths)


def mfu(flops: float, seconds: float, n_gpus: int, peak: float) -> float:
    """Achieved over peak: flops / (seconds · n_gpus · peak FLOP/s per GPU).

    With `model_flops` this is MFU (as Korthikanti et al. 2022 define it); with the
    FLOPs actually executed (`flops_per_iteration` with recomputation) it is
    their HFU, and Narayanan et al.'s "% of theoretical peak".
    """
    return flops / (seconds * n_gpus * peak)


def pipeline_idle(schedule, pp: int, microbatches: int, virtual: int = 1, t_f=1, t_b=1,
                  t_w=1) -> dict:
    """How long each pipeline rank idles in one iteration, in the units of ``t_f``, ``t_b``,
    ``t_w``: one forward, one input-gradient pass B and one weight-gradient pass W of one
    microbatch through one chunk (the whole backward is B + W; ``simulate``'s costs).
    ``{"idle", "stage_idle", "busy", "fraction"}``:

    * ``busy``: v·m·(t_f + t_b + t_w), every rank's work;
    * ``idle``: the iteration's length less ``busy`` — the same on every rank, what a step
      that waits for the whole pipeline (minitp's: the tied embedding's gradient all-reduce
      joins the first and last stage) loses; ``fraction`` = idle / busy;
    * ``stage_idle``: the most any stage idles between its own first and last unit, the
      "bubble size" of Qi et al. 2024, Table 2 (zero-bubble schedules need the paper's
      optimizer post-validation, §4, for that to be a step's whole loss; minitp has none).

    Closed forms, F, B, W for t_f, t_b, t_w; each equals `minitp.pipeline.simulate` with
    those costs (tests/calc/test_zero_bubble_calc.py) where its condition holds:

    * "gpipe", "1f1b", "interleaved": (p − 1)(F + B + W), any costs: the fraction
      (p − 1)/(v·m) of Narayanan et al. 2021, §2.2.1–2.2.2;
    * "zb-h1": (p − 1)(F + B) − (min(m, p) − 1)·W, i.e. Qi et al.'s (p − 1)(F + B − W)
      once m ≥ p (Table 2), when W ≤ F and W ≤ B: the late W's fill the drain. A heavier
      W leaves holes this formula misses: beyond that it is the paper's model only;
    * "zb-h2" (m ≥ 2p − 1, or ValueError as minitp refuses it): stage_idle
      (p − 1)·max(0, F + B − 2W), Qi et al.'s (p − 1)(F + B − 2W) (Table 2), 0 with unit
      costs, exact for minitp's order when W ≤ F or B ≤ F; idle (p − 1)·max(F, F + B − 2W),
      exact when B ≤ 2F: with unit costs (p − 1)F — the last stage's first forward waits
      (p − 1)F, the first stage ends that much earlier — as much as ZB-H1's (p − 1)(F+B−W)
      then (less when B > W, e.g. B = 2F with full recomputation).
      minitp's zb-h2 order is the greedy one for unit costs; other costs would call for
      another order (the paper's automatic scheduler, §3), not modelled.

    * "zbv", "dualpipev" (virtual = 2, two chunks placed in a V; m ≥ 2p − 1 and m ≥ 2p):
      minitp's orders are fixed ones tuned for F = B = W (Qi et al. 2024, §6; DeepSeek's
      dualpipev.py), and only then are they modelled here (a ValueError otherwise:
      `minitp.pipeline.simulate` plays them out for any costs): idle (p − 1)·F, the V's
      fill and drain; stage_idle 0 for ZBV, (p − 1)·F for DualPipeV (its F&B pairs run one
      after the other in minitp; DualPipe's runtime overlaps them, which this leaves out).

    GPipe, 1F1B and ZB-H1 idle their whole ``idle`` between first and last unit on the
    first stage (stage_idle = idle).
    """
    schedule = default_schedule(virtual) if schedule is None else schedule
    if schedule not in SCHEDULE_NAMES:
        raise ValueError(f"schedule must be one of {SCHEDULE_NAMES} (or None), got {schedule!r}")
    check_schedule(schedule, virtual, placement_of(schedule))
    check_zero_bubble(schedule, pp, microbatches, False)
    f, b, w = (Fraction(t) for t in (t_f, t_b, t_w))
    p, m = pp, microbatches
    stage_idle = None
    if schedule in V_SCHEDULES:
        if virtual != 2 or not f == b == w:
            raise ValueError(f"schedule {schedule!r} is modelled for virtual=2 and "
                             "t_f = t_b = t_w (its order is tuned for them); for other costs "
                             "play it out with minitp.pipeline.simulate")
        idle = (p - 1) * f
        stage_idle = Fraction(0) if schedule == "zbv" else idle
    elif schedule == "zb-h1":
        idle = (p - 1) * (f + b) - (min(m, p) - 1) * w
    elif schedule == "zb-h2":
        idle = (p - 1) * max(f, f + b - 2 * w)
        stage_idle = (p - 1) * max(Fraction(0), f + b - 2 * w)
    else:
        idle = (p - 1) * (f + b + w)
    busy = virtual * m * (f + b + w)
    stage_idle = idle if stage_idle is None else stage_idle
    return {"idle": number(idle), "stage_idle": number(stage_idle), "busy": number(busy),
            "fraction": number(idle / busy)}


def bubble(pp: int, microbatches: int, virtual: int = 1, schedule=None, t_f=1, t_b=1,
           t_w=1) -> int | float:
    """Pipeline bubble as a fraction of the ideal compute time: (p − 1)/(v·m).

    Narayanan et al. 2021, §2.2.1 (GPipe and 1F1B: (p − 1)/m) and §2.2.2
    (interleaved, v model chunks per GPU: (p − 1)/(v·m)), whatever the costs.
    ``schedule`` "zb-h1" or "zb-h2": `pipeline_idle`'s idle / busy with costs ``t_f``,
    ``t_b``, ``t_w`` (the paper's unit costs by default): ZB-H1 (p − 1)/(3m) for m ≥ p,
    ZB-H2 (p − 1)/(3m) too in one synchronous step (see `pipeline_idle`).
    """
    if schedule is None or schedule in ("gpipe", "1f1b", "interleaved"):
        if schedule is not None:
            check_schedule(schedule, virtual, placement_of(schedule))
        return number(Fraction(pp - 1, virtual * microbatches))
    return pipeline_idle(schedule, pp, microbatches, virtual, t_f, t_b, t_w)["fraction"]


def training_seconds(tokens: float, n_params: float, n_gpus: int, flops_per_gpu: float) -> float:
    """End-to-end training time ≈ 8TP/(nX): Narayanan et al. 2021, Eq. 4
    (T tokens, P parameters, n GPUs, X achieved FLOP/s per GPU; Eq. 3 with
    6h ≫ s and 16lh ≫ V, i.e. ≈ 8 FLOPs per parameter per token with recomputation)."""
    return 8 * tokens * n_params / (n_gpus * flops_per_gpu)
