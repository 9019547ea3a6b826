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

Modules: `params` (counts), `memory` (model states, activations), `loss` (the loss's
bytes, chunked or not), `comm` (bytes
per axis), `flops` (FLOPs, MFU, the bubble of every schedule, training time),
`pipeline_layout` (the layers over pipeline stages whose slowest stage is fastest), `cluster`
(hardware presets), `timing` (`step_time`), `tp_overlap` (what overlapping TP communication
saves), `plan` (enumerate, fit, rank), `two_d` (1D vs 2D
tensor parallelism of one linear layer: bytes, collectives, latency terms), `moe`
(a mixture of experts: total and active parameters, FLOPs from the active ones,
published shapes `MIXTRAL_8X7B` and `DEEPSEEK_V3`, expert vs tensor parallelism, the
step time with ep; its all-to-all bytes are in `comm`), `vision` (a vision-language model's
encoder replicated vs split over tp, trained or frozen: params, bytes, FLOPs), `vision_time`
(its time and the crossover width), `vision_stage` (the encoder on its own pipeline stage
and tp size), `hierarchy` (a two-level network, NVLink inside a node and InfiniBand across:
collectives' bytes and time per level, hierarchical all-reduce, FSDP against HSDP's bytes
across node boundaries, the level each axis lands on), `context_parallel` (context
parallelism's attentions — ring, all-gather, Ulysses, hybrid: what each keeps, its
messages' time per layer, `cp_crossover`; their bytes are `cp_comm_bytes`'s), `cp_overlap`
(what of those messages a step waits for once the ring hides its own behind attention),
`muon` (Muon's model-state bytes under ZeRO, and what each distributed strategy sends),
`checkpointing` (how often to save: Young's and Daly's intervals from a cluster's failure
rate and the save's bytes). `accuracy` (``python -m minitp.calc.accuracy``) sets the model
beside published runs (`accuracy_rows`) and writes docs/calc-accuracy.md; its error bands
per quantity are `accuracy_bands`.
"""

from .accuracy import bands as accuracy_bands
from .allreduce import ALLREDUCE_ALGORITHMS, AllReduceTime, allreduce_time
from .checkpointing import (
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
from .cluster import A100_80GB, B200_180GB, B200_XDR, CLUSTERS, DGX2H_V100, H100_80GB, Cluster
from .comm import (
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
from .context_parallel import (
    attention_kept_bytes,
    cp_crossover,
    cp_layer_seconds,
    kv_heads_per_tp_rank,
)
from .cp_core_memory import CoreBytes, cp_core_bytes
from .cp_overlap import attention_seconds, cp_exposed_seconds, ring_hop_and_block
from .flops import (
    bubble,
    flops_per_iteration,
    layer_matrix_flops,
    mfu,
    model_flops,
    pipeline_idle,
    training_seconds,
)
from .fp8 import (  # FP8 beside bf16, a model
    fp8_all_gather_bytes,
    fp8_linear_inputs_bytes,
    fp8_scale_count,
    fp8_tensor_bytes,
)
from .hierarchy import DPStep, LevelCost, axis_levels, collective, crossing_ratio, dp_step
from .loss import loss_bytes
from .memory import (
    OPTIMIZERS,
    activation_bytes,
    activation_bytes_per_layer,
    memory_per_gpu,
    microbatches_in_flight,
    model_state_bytes,
)
from .moe import (
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
from .muon import MUON_OPTIMIZERS, muon_comm_bytes, muon_state_bytes
from .params import (
    exact_param_count,
    expert_params_per_stage,
    layer_params_per_rank,
    padded_vocab,
    param_count,
    params_per_rank,
    params_per_stage,
    vision_params,
)
from .pipeline_layout import LayoutChoice, pipeline_layout
from .plan import Candidate, Plan, cp_variants, expert_parallel_sizes, plan
from .serving import (
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
from .timing import StepTime, microbatch_count, schedule_bubble, step_time
from .tp_overlap import OverlapModel, tp_overlap_model
from .two_d import tp1d_linear_bytes, tp2d_linear_bytes, tp2d_linear_parts, tp_linear_latency
from .vision import (
    LLAVA15_VISION,
    VisionEncoderShape,
    VisionLayoutCost,
    projector_params,
    vision_encoder_params,
    vision_forward_flops,
    vision_layout,
)
from .vision_stage import VisionStageCost, vision_encoder_stage
from .vision_time import VisionCrossover, vision_crossover, vision_step_time

__all__ = [
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
    "LayoutChoice", "pipeline_layout", "accuracy_bands",
]
