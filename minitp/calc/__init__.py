"""The analytical model: parameters, memory, communication, FLOPs, bubbles, time.

Pure functions of a `GPTConfig` and the parallel sizes, each documented with the
equation it implements and the paper it comes from; the tests check them
against the numbers the papers publish, and lessons set them beside what minitp
measures.

    import minitp.calc as calc
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=2048, n_layer=96, n_head=96, d_model=12288)
    calc.param_count(cfg)                                   # 174.6e9 (Narayanan Eq. 2)
    calc.memory_per_gpu(cfg, micro_batch=1, dp=8, pp=8, tp=8, sp=True, recompute="selective")
    calc.step_time(cfg, calc.A100_80GB, dp=16, pp=8, tp=8, global_batch=1536)

Its parts, by subject (each package's docstring names its modules; every public name is
re-exported here, so lessons write ``calc.step_time``, not the path):

    counts/         params (counts), flops (FLOPs, MFU, every schedule's bubble, training time)
    footprint/      memory (model states, activations), loss (the loss's bytes, chunked or
                    not), cp_core_memory, fp8 (FP8's bytes, scales included), muon (Muon's
                    state bytes under ZeRO and what each strategy sends)
    network/        cluster (hardware presets), comm (bytes per axis, the MoE all-to-all's
                    included), allreduce, hierarchy (NVLink inside a node, InfiniBand across),
                    two_d (1D vs 2D tensor parallelism), tp_overlap, context_parallel
                    (ring, all-gather, Ulysses, hybrid: what each keeps, its time, `cp_crossover`),
                    cp_overlap (what of the ring's messages a step waits for)
    planning/       timing (`step_time`), plan (enumerate, fit, rank), search (every
                    configuration, by brute force: the check on `plan`), pipeline_layout
    architectures/  moe (total and active parameters, `MIXTRAL_8X7B`, `DEEPSEEK_V3`, ep vs tp,
                    the step time with ep), mla (latent attention: parameters, FLOPs,
                    activations, tp bytes, `DEEPSEEK_V3_MLA`), vision, vision_time,
                    vision_stage (a vision-language model's encoder: bytes, FLOPs, time)
    inference/      serving (prefill and decode: FLOPs, bytes read, time per token), the
                    latent cache of multi-head latent attention beside GQA's, and per
                    rank under tp and under attention data parallelism
    reliability/    checkpointing (Young's and Daly's intervals from a failure rate)
    accuracy/       ``python -m minitp.calc.accuracy`` sets the model beside published runs
                    (`accuracy.rows`) and writes docs/calc-accuracy.md; only its error bands
                    per quantity are re-exported (`accuracy_bands`)
"""

from .accuracy.report import bands as accuracy_bands
from .architectures.mla import (
    DEEPSEEK_V3_MLA,
    MLAShape,
    mla_activation_bytes_per_layer,
    mla_cp_bytes_per_layer,
    mla_flops_per_token,
    mla_params,
    mla_tp_bytes_per_layer,
)
from .architectures.moe import (
    DEEPSEEK_V3,
    MIXTRAL_8X7B,
    MoEShape,
    MoEStepTime,
    ep_vs_tp,
    moe_flops_per_token,
    moe_params,
    moe_params_of,
    moe_step_time,
    node_limited_bytes,
)
from .architectures.moe_folding import (
    etp_extra_bytes,
    fold_vs_etp,
    folding_bytes,
    routed_expert_flops,
)
from .architectures.vision import (
    LLAVA15_VISION,
    VisionEncoderShape,
    VisionLayoutCost,
    projector_params,
    vision_encoder_params,
    vision_forward_flops,
    vision_layout,
)
from .architectures.vision_stage import VisionStageCost, vision_encoder_stage
from .architectures.vision_time import VisionCrossover, vision_crossover, vision_step_time
from .counts.flops import (
    bubble,
    flops_per_iteration,
    layer_matrix_flops,
    mfu,
    model_flops,
    pipeline_idle,
    training_seconds,
)
from .counts.params import (
    exact_param_count,
    expert_params_per_stage,
    layer_params_per_rank,
    padded_vocab,
    param_count,
    params_per_rank,
    params_per_stage,
    vision_params,
)
from .footprint.cp_core_memory import CoreBytes, cp_core_bytes
from .footprint.fp8 import (  # FP8 beside bf16, a model
    fp8_all_gather_bytes,
    fp8_linear_inputs_bytes,
    fp8_scale_count,
    fp8_tensor_bytes,
)
from .footprint.loss import loss_bytes
from .footprint.memory import (
    OPTIMIZERS,
    activation_bytes,
    activation_bytes_per_layer,
    memory_per_gpu,
    microbatches_in_flight,
    model_state_bytes,
)
from .footprint.muon import MUON_OPTIMIZERS, muon_comm_bytes, muon_state_bytes
from .inference.latent_cache import (
    DEEPSEEK_V3_LATENT,
    LatentShape,
    attention_dp_cache_bytes,
    latent_vs_heads_cache,
    mla_cache_bytes_per_token,
)
from .inference.serving import (
    LLAMA3_8B,
    LLAMA3_70B,
    DecoderShape,
    DecodeTime,
    critical_batch,
    decode_bytes_per_step,
    decode_flops_per_token,
    decode_intensity,
    decode_step_time,
    decode_vs_tp,
    kv_cache_bytes_per_token,
    max_decode_batch,
    prefill_flops,
    tp_stops_paying,
    weight_params_read,
)
from .network.allreduce import ALLREDUCE_ALGORITHMS, AllReduceTime, allreduce_time
from .network.cluster import (
    A100_80GB,
    B200_180GB,
    B200_XDR,
    CLUSTERS,
    DGX2H_V100,
    H100_80GB,
    Cluster,
)
from .network.comm import (
    comm_bytes,
    cp_comm_bytes,
    dp_comm_bytes,
    moe_all_to_all_bytes,
    moe_all_to_all_bytes_from_counts,
    pp_comm_bytes,
    ring_wire_bytes,
    tp_collectives_per_layer,
    tp_comm_bytes,
)
from .network.context_parallel import (
    attention_kept_bytes,
    cp_crossover,
    cp_layer_seconds,
    kv_heads_per_tp_rank,
)
from .network.cp_overlap import attention_seconds, cp_exposed_seconds, ring_hop_and_block
from .network.hierarchy import DPStep, LevelCost, axis_levels, collective, crossing_ratio, dp_step
from .network.tp_overlap import OverlapModel, tp_overlap_model
from .network.two_d import (
    tp1d_linear_bytes,
    tp2d_linear_bytes,
    tp2d_linear_parts,
    tp_linear_latency,
)
from .planning.pipeline_layout import LayoutChoice, pipeline_layout
from .planning.plan import Candidate, Plan, cp_variants, expert_parallel_sizes, plan
from .planning.timing import StepTime, microbatch_count, schedule_bubble, step_time
from .reliability.checkpointing import (
    LLAMA3_405B,
    FailureRecord,
    SavePlan,
    daly_interval,
    expected_seconds,
    failure_rate,
    job_mtbf_seconds,
    lost_fraction,
    save_plan,
    save_seconds,
    young_interval,
)

__all__ = [
    "accuracy_bands",
    "A100_80GB", "CLUSTERS", "Candidate", "Cluster", "DEEPSEEK_V3", "DGX2H_V100", "H100_80GB",
    "MIXTRAL_8X7B", "MoEShape", "MoEStepTime", "OPTIMIZERS", "ep_vs_tp", "expert_parallel_sizes",
    "expert_params_per_stage", "layer_matrix_flops", "moe_all_to_all_bytes",
    "moe_all_to_all_bytes_from_counts", "moe_flops_per_token", "moe_params", "moe_params_of",
    "moe_step_time", "node_limited_bytes",
    "OverlapModel", "Plan", "StepTime", "activation_bytes", "activation_bytes_per_layer", "bubble",
    "comm_bytes", "cp_comm_bytes", "dp_comm_bytes", "exact_param_count", "flops_per_iteration",
    "layer_params_per_rank", "loss_bytes", "memory_per_gpu", "mfu", "microbatch_count",
    "microbatches_in_flight", "model_flops", "model_state_bytes", "padded_vocab",
    "param_count", "params_per_rank", "params_per_stage", "vision_params", "pipeline_idle", "plan",
    "pp_comm_bytes", "schedule_bubble",
    "ring_wire_bytes", "step_time", "tp1d_linear_bytes", "tp2d_linear_bytes",
    "tp2d_linear_parts", "tp_collectives_per_layer", "tp_comm_bytes", "tp_linear_latency",
    "tp_overlap_model", "training_seconds",
    "LLAVA15_VISION", "VisionCrossover", "VisionEncoderShape", "VisionLayoutCost",
    "vision_crossover", "vision_encoder_params", "vision_forward_flops", "vision_layout",
    "vision_step_time", "VisionStageCost", "projector_params", "vision_encoder_stage",
    "CoreBytes", "attention_kept_bytes", "cp_core_bytes", "cp_crossover", "cp_layer_seconds",
    "cp_variants", "kv_heads_per_tp_rank", "attention_seconds", "cp_exposed_seconds",
    "ring_hop_and_block",
    "LLAMA3_405B", "FailureRecord", "SavePlan", "daly_interval", "expected_seconds",
    "failure_rate", "job_mtbf_seconds", "lost_fraction", "save_plan", "save_seconds",
    "young_interval", "MUON_OPTIMIZERS", "muon_comm_bytes", "muon_state_bytes",
    "B200_180GB", "B200_XDR", "DPStep", "LevelCost", "axis_levels", "collective",
    "crossing_ratio", "dp_step",
    "LLAMA3_8B", "LLAMA3_70B", "DecoderShape", "DecodeTime", "critical_batch",
    "decode_bytes_per_step", "decode_flops_per_token", "decode_intensity", "decode_step_time",
    "decode_vs_tp", "kv_cache_bytes_per_token", "max_decode_batch", "prefill_flops",
    "tp_stops_paying", "weight_params_read", "ALLREDUCE_ALGORITHMS", "AllReduceTime",
    "allreduce_time", "fp8_all_gather_bytes", "fp8_linear_inputs_bytes",
    "fp8_scale_count", "fp8_tensor_bytes",
    "LayoutChoice", "pipeline_layout",
    "DEEPSEEK_V3_LATENT", "LatentShape", "latent_vs_heads_cache", "mla_cache_bytes_per_token",
    "attention_dp_cache_bytes", "DEEPSEEK_V3_MLA", "MLAShape", "mla_activation_bytes_per_layer",
    "mla_cp_bytes_per_layer", "mla_flops_per_token", "mla_params", "mla_tp_bytes_per_layer",
    "etp_extra_bytes", "fold_vs_etp", "folding_bytes", "routed_expert_flops",
]
