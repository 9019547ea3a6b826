"""What PyTorch's own parallelism (`minitp.torch_parallel`) can run, each limit said once.

torch's path covers tensor parallelism (DTensor's column, row and sequence-parallel styles),
FSDP2 (``fully_shard``, ZeRO-3's design) and HSDP over the data-parallel axis, for the
GPT-2-shaped model. What minitp does and that path does not (a pipeline, context
parallelism, experts, a vision encoder, grouped-query attention) is refused here, in one
line naming what to use instead: minitp's own implementation of the same run.
"""

from __future__ import annotations

USE_MINITP = "use minitp's own (--impl minitp, the default; mt.parallelize)"


def check_torch_mesh(dp: int, pp: int, cp: int, tp: int, hsdp: int | None) -> None:
    """A (dp, tp) mesh, optionally HSDP with `hsdp` replicas that divide dp."""
    if pp > 1:
        raise ValueError(f"torch's parallelism here has no pipeline (pp={pp}): {USE_MINITP}")
    if cp > 1:
        raise ValueError(f"torch's parallelism here has no context parallelism (cp={cp}): "
                         f"{USE_MINITP}")
    if hsdp is not None:
        if not isinstance(hsdp, int) or isinstance(hsdp, bool) or hsdp < 1 or dp % hsdp:
            raise ValueError(f"hsdp={hsdp!r} must be a whole number of replicas dividing "
                             f"dp={dp} (dp/hsdp ranks shard each replica)")


def check_torch_model(n_experts: int, vision_patches: int, n_kv_head, mlp: str) -> None:
    """The model torch's plan is written for: fused qkv, a GELU MLP, no experts, text only."""
    for wrong, what in ((n_experts > 0, "mixture of experts"),
                        (vision_patches > 0, "a vision-language model"),
                        (n_kv_head is not None, "separate q/kv projections (--arch llama)"),
                        (mlp != "gelu", f"the {mlp} MLP")):
        if wrong:
            raise ValueError(f"torch's tensor-parallel plan here covers the GPT-2 model, not "
                             f"{what}: {USE_MINITP}")


def check_torch_options(dp: int, zero_stage: int = 3, recompute=None, tp_overlap: bool = False,
                        param_dtype=None) -> None:
    """Options minitp's step has and torch's path here does not. Over dp > 1 the path
    always shards as ZeRO-3 does (``fully_shard``), so that is the stage to ask for."""
    if dp > 1 and zero_stage != 3:
        raise ValueError(f"torch's path shards over dp={dp} as ZeRO-3 does (fully_shard), "
                         f"not as stage {zero_stage}: give --zero-stage 3, or {USE_MINITP}")
    for wrong, what in ((recompute is not None, f"recompute={recompute!r}"),
                        (tp_overlap, "tp_overlap"), (param_dtype is not None, "mixed precision")):
        if wrong:
            raise ValueError(f"torch's path here does not do {what}: {USE_MINITP}")
