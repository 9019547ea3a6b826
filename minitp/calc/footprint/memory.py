"""Memory per GPU: model states (ZeRO, Megatron-LM) and activations (Korthikanti et al.).

Bytes throughout. Values that are not whole come back as floats, whole ones as ints.
"""

from __future__ import annotations

from fractions import Fraction

from ...rules import (
    V_SCHEDULES,
    check_recompute,
    check_zero_bubble,
    check_zero_stage,
    interleaving_fits,
)
from .._util import number
from ..architectures.mla import MLAShape, mla_activation_bytes_per_layer
from ..counts.params import (
    expert_params_per_stage,
    ffn_width,
    latent,
    params_per_stage,
    swiglu,
)
from ..network.context_parallel import attention_kept_bytes

# bytes per parameter: (parameters, gradients, optimizer state)
OPTIMIZERS = {
    # Rajbhandari et al. 2020 (ZeRO), §3.1: fp16 parameters and gradients, and Adam's
    # fp32 copy of the parameters, momentum and variance: 2 + 2 + 12 = 16 ("K = 12").
    "adam-mixed": (2, 2, 12),
    # Megatron-LM with bf16 parameters accumulates gradients in fp32: 2 + 4 + 12 = 18
    # (the table in Megatron-LM's docs on its distributed optimizer).
    "megatron": (2, 4, 12),
    # Everything in fp32: parameters, gradients, momentum, variance: 4 + 4 + 8 = 16.
    "adam-fp32": (4, 4, 8),
}


def model_state_bytes(n_params: int, dp: int = 1, zero_stage: int = 0,
                      optimizer: str = "adam-mixed", *, expert_params: int = 0,
                      ep: int = 1) -> dict:
    """Parameters, gradients and optimizer state on one data-parallel rank, in bytes:
    ``{"parameters", "gradients", "optimizer", "total"}``.

    ZeRO (Rajbhandari et al. 2020, §5 and Table 1) shards across the d ranks:
    stage 1 the optimizer state (4Ψ + 12Ψ/d for "adam-mixed"), stage 2 also the
    gradients (2Ψ + 14Ψ/d), stage 3 also the parameters (16Ψ/d). Megatron-LM's
    distributed optimizer is stage 1 of its 18-byte layout: 6 + 12/d bytes per
    parameter (``optimizer="megatron", zero_stage=1``). minitp runs all four stages
    (`minitp.data_parallel.zero`); tests/data_parallel/test_zero.py measures them beside this.

    A mixture of experts with expert parallelism: ``expert_params`` of the ``n_params``
    (both as one device holds them) are routed experts'. A rank holds 1/ep of them, with
    their gradients and optimizer state; ZeRO shards those over the dp/ep ranks that hold
    the same experts (`Mesh.expert_dp`), the dense rest over dp as before, at every stage
    (`minitp.data_parallel`: a layer's experts are a unit of their own).
    tests/expert_parallel/test_moe_measured.py measures it.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
    check_zero_stage(zero_stage)
    if not 0 <= expert_params <= n_params or ep < 1 or expert_params % ep or (
            zero_stage and dp % ep):
        raise ValueError(f"expert_params={expert_params} of n_params={n_params} over ep={ep} "
                         f"(dp={dp}): ep must divide the experts' parameters and, with ZeRO, dp")
    sharded = {"optimizer": zero_stage >= 1, "gradients": zero_stage >= 2,
               "parameters": zero_stage >= 3}
    result = {}
    for kind, per_param in zip(("parameters", "gradients", "optimizer"), OPTIMIZERS[optimizer],
                               strict=True):
        dense = Fraction((n_params - expert_params) * per_param)
        experts = Fraction(expert_params * per_param, ep)
        if sharded[kind]:
            dense, experts = dense / dp, experts / (dp // ep)
        result[kind] = number(dense + experts)
    result["total"] = number(sum(Fraction(v) for v in result.values()))
    return result


def activation_bytes_per_layer(cfg, micro_batch: int, tp: int = 1, sp: bool = False,
                               recompute=None, cp: int = 1,
                               cp_comm: str = "ring") -> int | float:
    """Bytes one transformer layer keeps for backward on one rank: Korthikanti et
    al. 2022 (arXiv 2205.05198), §4, Table 2 (16-bit activations, 1-byte masks)::

        none             sbh(34 + 5as/h)          tp+selective     sbh(10 + 24/t)
        tp               sbh(10 + 24/t + 5as/ht)  tp+sp+selective  34sbh/t
        tp+sp            sbh/t · (34 + 5as/h)     full             2sbh

    One expression gives the first five: 10sbh (the two LayerNorm inputs, the
    inputs of the qkv and fc layers, two dropout masks: split only by sequence
    parallelism) + 24sbh/t (Q, K, V, the projection input, GELU's input and
    output: split by tensor parallelism) + 5as²b/t (softmax output, its dropout
    mask and output: gone under selective recomputation); t = 1 is the "none" row.
    Full recomputation keeps the layer's input, 2sbh; with sequence parallelism
    that input is a sequence shard, 2sbh/t (not a row of Table 2).

    The Llama-style parts (`minitp.GPTConfig.llama`; a MODEL: Table 2's tensor-by-tensor
    count carried over to them, the same 16-bit activations and 1-byte masks). f is the
    MLP's width (``cfg.ffn_width``), d = h/a the head dimension, K the K/V heads:

    * RMSNorm (Zhang and Sennrich 2019) keeps its input, as LayerNorm: the 10sbh is
      unchanged (the two norms' inputs 4sbh, the attention's and the MLP's inputs 4sbh,
      the two dropout masks 2sbh; q and kv read one input, kept once);
    * rotary positions (Su et al. 2021): the rotated q and k are what attention keeps;
      the rotation multiplies by fixed cos/sin tables, so autograd keeps the tables, not
      the unrotated q and k: no term of its own;
    * grouped-query attention (Ainslie et al. 2023): the kv projection gives K heads;
      the attention core repeats them to its a heads (Megatron-LM's unfused core does
      the same) and QKᵀ and ·V keep the repeated K and V, 4sbh/t as GPT-2's. Under
      selective recomputation the core's inputs are kept instead, K and V still at
      their K heads: 4sbd·K/t (each rank's K/t), or 4sbd where t exceeds K (each rank
      computes its one replicated K/V head, `minitp.tensor_parallel.kv_heads`);
    * the MLP: GELU keeps its input and output, 2sbf + 2sbf (16sbh at f = 4h); a
      SwiGLU (Shazeer 2020) its fc output 2f wide (silu's input and the up half,
      4sbf), silu's output (2sbf) and the product, proj's input (2sbf): 8sbf, split by t.

    So GPT-2's 24sbh/t is (4sbh + 4sbh [K, V] + 4sbf [GELU]) / t in general, and a
    Llama layer keeps sbh(10 + (8 + 8f/h)/t) + 5as²b/t: 10 + (8 + 64/3)/t at f = 8h/3.
    With ``cfg.dropout`` = 0 torch keeps no dropout masks and the attention dropout's
    output is the softmax's (2sbh, /t with sequence parallelism, and 3as²b/t fewer):
    the formula, as Table 2, counts them anyway. tests/calc/test_llama_calc.py sets
    the `ActivationLedger` beside it on minitp's models, every byte of the difference
    named (torch's CPU RMSNorm keeps a float32 input and x/rms, the rotary cos/sin
    tables, kv's own sequence gather, ...).

    Context parallelism (cp = c > 1) is a MODEL here, not in the paper: each rank
    holds s/c of the sequence, so every term is divided by c — the attention term
    counted as this rank's s/c queries against all s keys, 5as²b/(tc), which a
    ring that kept its probabilities would keep. minitp's ring keeps none (it
    recomputes them in backward from the saved log-sum-exp, as flash attention
    does): for it the selective row, divided by c, is the closer model; the
    ledger measures it (tests/context_parallel/test_context_parallel.py: 1/c per rank).
    The attention's part, by ``cp_comm``
    (`minitp.calc.network.context_parallel.attention_kept_bytes`):
    "allgather" keeps K and V whole, 4sbh/t (not /c: every rank holds the gathered
    sequence); Ulysses ("a2a", "a2a+ring") keeps 1/c of the heads at the whole s —
    probabilities, Q, K and V alike, the ring's count. Selective recomputation reruns the
    attention with its collectives and keeps this rank's inputs: the same under every one.
    """
    check_recompute(recompute)
    s, b, h = cfg.seq_len, micro_batch, cfg.d_model
    sbh = s * b * h
    if recompute == "full":
        return number(Fraction(2 * sbh, (tp if sp else 1) * cp))
    replicated = Fraction(10 * sbh, (tp if sp else 1) * cp)
    proj_input = Fraction(2 * sbh, tp * cp)
    mlp = Fraction((8 if swiglu(cfg) else 4) * s * b * ffn_width(cfg), tp * cp)
    attention = (mla_activation_bytes_per_layer(MLAShape.of(cfg), s, b, tp, recompute, cp,
                                                cp_comm) if latent(cfg)  # calc/architectures/mla
                 else attention_kept_bytes(cfg, micro_batch, tp, cp, cp_comm, recompute))
    return number(replicated + proj_input + mlp + sum(attention.values()))


def microbatches_in_flight(pp: int, microbatches: int | None = None,
                           schedule: str | None = "1f1b") -> int:
    """How many microbatches' activations the first pipeline stage holds at its peak.

    GPipe (all forwards, then all backwards) holds all m. 1F1B limits them to the
    pipeline depth p (Narayanan et al. 2021, §2.2.1), or m if m < p; m = None
    means m ≥ p. A zero-bubble schedule holds a microbatch from its forward until its
    W pass (`minitp.pipeline.schedules`): ZB-H1 p, as 1F1B, on every stage, or m if
    m < p; ZB-H2 2p − 1 on every stage (Qi et al. 2024, Table 2: pM_B and (2p−1)M_B);
    it needs m ≥ 2p − 1 (m = None means so), and minitp refuses fewer
    (`minitp.rules.check_zero_bubble`): a ValueError here too. On two chunks placed in a
    V (half a stage each) ZBV peaks at 2p chunks, p stages' worth, as 1F1B (Qi et al.
    2024, §6), and DualPipeV at 2p + 1 chunks, p + 1/2 (DeepSeek's table: "PP + 1" for
    PP = 2p stages; deepseek-ai/DualPipe, README.md), both counted from minitp's orders
    (`minitp.pipeline.simulate`'s peak). ``None``: 1F1B.
    """
    schedule = "1f1b" if schedule is None else schedule
    if schedule == "gpipe":
        if microbatches is None:
            raise ValueError("schedule='gpipe' holds every microbatch: give microbatches")
        return microbatches
    if schedule == "zb-h2":
        check_zero_bubble(schedule, pp, microbatches, False)
        return 2 * pp - 1
    if schedule in V_SCHEDULES:  # peaks of 2p and 2p+1 chunks of half a stage each
        check_zero_bubble(schedule, pp, microbatches, False)
        return pp if schedule == "zbv" else number(Fraction(2 * pp + 1, 2))
    if schedule not in ("1f1b", "zb-h1"):
        raise ValueError("schedule must be 'gpipe', '1f1b', 'zb-h1', 'zb-h2', 'zbv' or "
                         f"'dualpipev', got {schedule!r}")
    return pp if microbatches is None else min(pp, microbatches)


def activation_bytes(cfg, micro_batch: int, tp: int = 1, sp: bool = False, recompute=None,
                     pp: int = 1, virtual: int = 1, microbatches: int | None = None,
                     schedule: str | None = "1f1b", cp: int = 1,
                     cp_comm: str = "ring") -> int | float:
    """Activation bytes on a rank of the first pipeline stage, the most loaded one:
    `activation_bytes_per_layer` × l/p layers × microbatches in flight.

    With 1F1B and m ≥ p that is p · l/p = l layers' worth whatever p is
    (Korthikanti et al. 2022, §4.2.3: 34sbhl/t with SP and selective
    recomputation). The interleaved schedule (``virtual`` = v > 1 chunks per
    stage) holds l·(1 + (p−1)/(pv)) (same section): Megatron-LM's warm-up runs
    2(p−1) + (v−1)p forward chunks of l/(pv) layers on the first stage, plus one
    in the steady state. Left out, as the paper finds them negligible (§4.3):
    the embedding's dropout mask and the output layer and loss (the loss's bytes, chunked
    or not, are `minitp.calc.footprint.loss.loss_bytes`'s). ``schedule``: as
    `microbatches_in_flight` ("interleaved" or None with v > 1); a zero-bubble schedule
    counts each microbatch waiting for its W as a whole one (an upper bound: W needs
    less than B, Qi et al. 2024, Table 1, M_W < M_B). ``cp_comm``: context parallelism's
    attention (`activation_bytes_per_layer`).
    """
    per_layer = Fraction(activation_bytes_per_layer(cfg, micro_batch, tp, sp, recompute, cp,
                                                    cp_comm))
    if cfg.n_layer % (pp * virtual):
        raise ValueError(f"n_layer={cfg.n_layer} is not divisible by pp*virtual={pp * virtual}")
    layers = Fraction(cfg.n_layer, pp)
    if schedule in V_SCHEDULES:  # two chunks of l/(2p) layers: in_flight counts whole stages
        return number(per_layer * layers * microbatches_in_flight(pp, microbatches, schedule))
    if virtual > 1:
        if schedule not in (None, "1f1b", "interleaved"):
            raise ValueError(f"schedule {schedule!r} with virtual={virtual}: only the "
                             "interleaved schedule has virtual stages")
        if microbatches is not None and not interleaving_fits(pp, microbatches):
            raise ValueError(f"the interleaved schedule needs microbatches ({microbatches}) "
                             f"divisible by pp ({pp})")
        return number(per_layer * layers * pp * (1 + Fraction(pp - 1, pp * virtual)))
    return number(per_layer * layers * microbatches_in_flight(pp, microbatches, schedule))


def memory_per_gpu(cfg, micro_batch: int, dp: int = 1, pp: int = 1, tp: int = 1,
                   sp: bool = False, recompute=None, zero_stage: int = 0,
                   optimizer: str = "adam-mixed", virtual: int = 1,
                   microbatches: int | None = None, cp: int = 1, ep: int = 1,
                   schedule: str | None = None, cp_comm: str = "ring") -> dict:
    """Bytes on the busiest GPU: the model states of the largest pipeline stage
    (`params_per_rank`, `model_state_bytes`) and the first stage's activations.
    ``{"parameters", "gradients", "optimizer", "activations", "total"}``.
    With context parallelism ZeRO shards over dp·cp (as minitp does, over
    `Mesh.dp_cp`) and the activations are divided by cp (a model).
    ``ep``: a mixture of experts' experts over ep of the dp·cp ranks (`model_state_bytes`);
    its activations are modelled as a dense layer's (the k expert MLPs each token runs
    keep more: not modelled). ``schedule``: the pipeline's (`activation_bytes`); None
    is 1F1B, or the interleaved one with virtual > 1. ``cp_comm``: context parallelism's
    attention ("allgather" keeps K and V whole: `activation_bytes_per_layer`)."""
    held = params_per_stage(cfg, tp, pp, ep)
    stage = held.index(max(held))
    states = model_state_bytes(params_per_stage(cfg, tp, pp)[stage], dp * cp, zero_stage,
                               optimizer, expert_params=expert_params_per_stage(cfg, pp)[stage],
                               ep=ep)
    del states["total"]
    states["activations"] = activation_bytes(cfg, micro_batch, tp, sp, recompute, pp,
                                             virtual, microbatches, schedule, cp, cp_comm)
    states["total"] = number(sum(Fraction(v) for v in states.values()))
    return states
