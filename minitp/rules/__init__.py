"""The rules: torch-free, each written once with its one message, read by the model, the
axes, the calculator, the runtime and the CLI alike.

* `parallel`: `check_parallel_config`, the one validator of a parallel configuration
  (what divides what), `check_step` (what a training step adds), the recompute modes, the
  ZeRO stages, context parallelism's load-balanced chunks;
* `heads`: whole heads, K/V heads split or replicated, whole MLP features over tp;
* `schedules`: the pipeline schedules' names and needs, placements, the units' labels;
* `experts`: what a mixture of experts may be, and what ep needs of the mesh;
* `mla`: what latent attention's sizes may be, and the axes it is split over (not cp);
* `vision`: a vision encoder's layouts over tp; the image patch format;
* `sizes`: positive sizes, equal slices; `tokens`: token ids and the ignored target, and
  packing's refusal;
* `loss_chunks`: how many tokens' logits the loss widens to float32 at once;
* `labels`: the trace's layer labels; `ring_bytes`: the ring algorithm's byte MODEL;
* `layouts`: pipeline layouts, which layers each stage holds (a Megatron-style string, counts
  or lists), every layer placed exactly once;
* `cp_comm`: context parallelism's attention variants (ring, allgather, a2a, a2a+ring,
  allgather-regather) and what each needs; `cp_bytes`: their byte MODEL.
"""

from .cp_bytes import (
    cp_attention_bytes,
    ring_attention_bytes,
)
from .cp_comm import (
    CP_COMMS,
    check_cp_comm,
    ulysses_size,
)
from .experts import (
    BALANCES,
    ROUTERS,
    check_ep_divides_dp_cp,
    check_expert_mesh,
    check_expert_parallel,
    check_folded_slice,
    check_moe_config,
    expert_compute_copies,
    expert_meshes,
    folded,
)
from .heads import (
    check_tp_widths,
    check_ulysses_heads,
    kv_heads_per_rank,
    kv_layout,
    ulysses_kv_layout,
)
from .labels import (
    LAYER_LABEL,
    layer_label,
    parse_layer_label,
)
from .layouts import (
    check_every_layer_once,
    layout_stages,
    layout_text,
    parse_layout,
)
from .loss_chunks import (
    loss_chunk_rows,
)
from .parallel import (
    PARAM_DTYPES,
    RECOMPUTE_MODES,
    ZERO_STAGES,
    check_context_split,
    check_parallel_config,
    check_param_dtype,
    check_recompute,
    check_step,
    check_tp_overlap,
    check_world_size,
    check_zero_stage,
    cp_chunks,
)
from .ring_bytes import (
    ring_send_fraction,
    ring_wire_bytes,
)
from .schedules import (
    PLACEMENTS,
    SCHEDULE_NAMES,
    UNIT_KINDS,
    V_SCHEDULES,
    ZERO_BUBBLE_SCHEDULES,
    check_microbatches,
    check_placement,
    check_schedule,
    check_schedule_fits_pipeline,
    check_zero_bubble,
    default_schedule,
    interleaving_fits,
    minimum_microbatches,
    model_chunks,
    model_placement,
    parse_unit_label,
    placement_of,
    rank_and_chunk,
    stage_of,
    unit_label,
)
from .sizes import (
    ceil_div,
    check_positive_int,
    check_timeout,
    round_up,
)
from .tokens import (
    IGNORE_INDEX,
    SEQ_DIM,
    TOKEN_ID_DTYPE,
    check_packing,
    check_positions,
    check_token_ids,
)
from .vision import (
    CELL_H,
    CELL_W,
    PATCH_H,
    PATCH_W,
    PATCHES_PER_CHAR,
    VISION_LAYOUTS,
    check_vision_layout,
    default_vision_patches,
)

__all__ = [
    "BALANCES",
    "CELL_H",
    "CELL_W",
    "CP_COMMS",
    "IGNORE_INDEX",
    "LAYER_LABEL",
    "PARAM_DTYPES",
    "PATCHES_PER_CHAR",
    "PATCH_H",
    "PATCH_W",
    "PLACEMENTS",
    "RECOMPUTE_MODES",
    "ROUTERS",
    "SCHEDULE_NAMES",
    "SEQ_DIM",
    "TOKEN_ID_DTYPE",
    "UNIT_KINDS",
    "VISION_LAYOUTS",
    "V_SCHEDULES",
    "ZERO_BUBBLE_SCHEDULES",
    "ZERO_STAGES",
    "ceil_div",
    "check_context_split",
    "check_cp_comm",
    "check_ep_divides_dp_cp",
    "check_every_layer_once",
    "check_expert_mesh",
    "check_expert_parallel",
    "check_folded_slice",
    "expert_compute_copies",
    "expert_meshes",
    "folded",
    "check_microbatches",
    "check_moe_config",
    "check_packing",
    "check_parallel_config",
    "check_param_dtype",
    "check_placement",
    "check_positions",
    "check_positive_int",
    "check_recompute",
    "check_schedule",
    "check_schedule_fits_pipeline",
    "check_step",
    "check_token_ids",
    "check_timeout",
    "check_tp_overlap",
    "check_tp_widths",
    "check_ulysses_heads",
    "check_vision_layout",
    "check_world_size",
    "check_zero_bubble",
    "check_zero_stage",
    "cp_attention_bytes",
    "cp_chunks",
    "default_schedule",
    "default_vision_patches",
    "interleaving_fits",
    "kv_heads_per_rank",
    "kv_layout",
    "layer_label",
    "layout_stages",
    "layout_text",
    "loss_chunk_rows",
    "minimum_microbatches",
    "model_chunks",
    "model_placement",
    "parse_layer_label",
    "parse_layout",
    "parse_unit_label",
    "placement_of",
    "rank_and_chunk",
    "ring_attention_bytes",
    "ring_send_fraction",
    "ring_wire_bytes",
    "round_up",
    "stage_of",
    "ulysses_kv_layout",
    "ulysses_size",
    "unit_label",
]
