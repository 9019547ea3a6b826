"""What a (dp, pp, cp, tp, ep) split of a model needs: `check_parallel_config`, the one
validator of a parallel configuration, and the rules it reads from its neighbours (heads,
schedules, experts, vision). Context parallelism's load-balanced chunks are here too:
which two of a sequence's 2·cp chunks each cp rank holds (`cp_chunks`)."""

from __future__ import annotations

from .cp_comm import check_cp_comm
from .experts import check_expert_parallel, check_folded_slice
from .heads import check_tp_widths
from .layouts import layout_stages
from .mla import check_mla_parallel
from .schedules import (
    check_placement,
    check_schedule,
    check_schedule_fits_pipeline,
    check_zero_bubble,
    interleaving_fits,
)
from .sizes import check_positive_int
from .vision import check_vision_layout

RECOMPUTE_MODES = (None, "selective", "full")
# ZeRO (Rajbhandari et al. 2020) shards over the data-parallel axis: 0 nothing (plain
# data parallelism), 1 the optimizer state, 2 also the gradients, 3 also the parameters.
ZERO_STAGES = (0, 1, 2, 3)
# Parameter dtypes `parallelize` can cast to: None keeps the reference model's dtype;
# "bfloat16" is mixed precision (`minitp.mixed_precision`). float16 would need loss scaling.
PARAM_DTYPES = (None, "bfloat16")


# --------------------------------------------------------------------------- checks
def check_recompute(mode) -> None:
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be None, 'selective' or 'full', got {mode!r}")


def check_tp_overlap(tp_overlap: bool, sequence_parallel: bool, tp: int) -> None:
    """The collective matmul overlaps sequence parallelism's all-gathers and
    reduce-scatters with the GEMMs: without SP, or at tp 1, there is nothing to overlap."""
    if tp_overlap and not (sequence_parallel and tp > 1):
        raise ValueError(f"tp_overlap=True needs sequence_parallel=True and tp > 1 (got "
                         f"sequence_parallel={sequence_parallel}, tp={tp}): it overlaps "
                         "sequence parallelism's collectives with the GEMMs")


def check_zero_stage(stage) -> None:
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES} (0: no ZeRO; 1 shards the "
                         f"optimizer state, 2 also gradients, 3 also parameters), got {stage!r}")


def check_param_dtype(name) -> None:
    """`name`: a parameter dtype's name ("bfloat16") or None (keep the model's)."""
    if name not in PARAM_DTYPES:
        hint = (" (float16 also needs loss scaling, which minitp does not do)"
                if name == "float16" else " (for one dtype throughout, cast the model itself)")
        raise ValueError(f"param_dtype must be None or bfloat16, got {name!r}{hint}")


def cp_chunks(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two of a sequence's 2·cp equal chunks that context-parallel rank `cp_rank`
    holds: chunk i and chunk 2cp−1−i, one early and one late, so that under the
    causal mask every rank does the same attention work (rank 0 of cp=2 holds
    chunks 0 and 3, rank 1 chunks 1 and 2)."""
    if not 0 <= cp_rank < cp:
        raise ValueError(f"cp rank {cp_rank} is not in 0..{cp - 1}")
    return cp_rank, 2 * cp - 1 - cp_rank


def check_context_split(seq_len: int, cp: int, tp: int = 1,
                        sequence_parallel: bool = False) -> None:
    """A sequence of `seq_len` tokens can be split over cp ranks (2·cp equal chunks)
    and, with sequence parallelism, each rank's seq_len/cp tokens over tp."""
    if cp > 1 and seq_len % (2 * cp):
        raise ValueError(
            f"seq_len={seq_len} is not divisible by 2*cp={2 * cp}: context parallelism cuts "
            "the sequence into 2·cp equal chunks, two per rank (one early, one late), so "
            "that every rank does the same causal-attention work")
    if sequence_parallel and (seq_len // cp) % tp:
        raise ValueError(
            f"seq_len={seq_len} is not divisible by cp*tp={cp * tp}: sequence parallelism "
            f"gives every tp rank an equal slice of this cp rank's {seq_len // cp} tokens")


def check_parallel_config(cfg, mesh=None, *, dp: int = 1, pp: int = 1, tp: int = 1,
                          cp: int = 1, sequence_parallel: bool = False, recompute=None,
                          virtual_stages: int = 1, world_size: int | None = None,
                          schedule=None, microbatches: int | None = None,
                          batch_size: int | None = None, zero_stage: int = 0, ep: int = 1,
                          param_dtype: str | None = None, tp_overlap: bool = False,
                          placement: str = "loop", vision_layout: str = "replicated",
                          cp_comm: str = "ring", cp_a2a_size: int | None = None,
                          pipeline_layout=None, etp: int = 1, fold: bool = False) -> None:
    """Raise a clear ValueError if the model `cfg` (a GPTConfig) cannot be split
    this way: the one validator of a parallel configuration, run once per launch.

    Where the sizes are known before any process starts (the CLI, the graders, the
    calculator), the parent calls it with all of them, and the ranks trust what they are
    given (``parallelize(..., validated=True)``). A function of your own launched with
    `mt.launch` is checked on its ranks instead, once: by `parallelize` (given its `mesh`,
    whose axis sizes and world size stand for dp, pp, cp, tp, ep and world_size), and by
    `train_step` for what a step adds (`check_step`, the first time it sees them).
    ep, etp, fold: `minitp.rules.experts.check_expert_parallel`. placement: where the pipeline's
    chunks sit ("loop" or "v": `minitp.rules.schedules`). vision_layout: a
    vision-language model's encoder over tp (`minitp.rules.vision`). cp_comm, cp_a2a_size:
    context parallelism's attention (`minitp.rules.cp_comm`). pipeline_layout: which layers
    each stage holds, when not n_layer/(pp·virtual_stages) each (`minitp.rules.layouts`)."""
    if mesh is not None:
        dp, pp, cp, tp = mesh.dp.size, mesh.pp.size, mesh.cp.size, mesh.tp.size
        ep, world_size = mesh.ep.size, mesh.world_size
        etp, fold = mesh.etp.size, mesh.fold
    for name, value in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp), ("ep", ep), ("etp", etp),
                        ("virtual_stages", virtual_stages)):
        check_positive_int(name, value)
    if world_size is not None:
        check_world_size(world_size, dp=dp, pp=pp, cp=cp, tp=tp)
    check_tp_widths(cfg, tp)
    check_vision_layout(cfg, vision_layout, tp, cp)
    check_cp_comm(cfg, cp, tp, cp_comm, cp_a2a_size)
    check_mla_parallel(cfg, cp, cp_comm)
    if sequence_parallel and cp == 1 and cfg.seq_len % tp:
        raise ValueError(
            f"seq_len={cfg.seq_len} is not divisible by tp={tp}: sequence parallelism gives "
            "every rank an equal slice of the sequence"
        )
    if cp > 1:
        check_context_split(cfg.seq_len, cp, tp, sequence_parallel)
        if cfg.dropout > 0:
            raise ValueError(
                f"dropout={cfg.dropout} with cp={cp}: context parallelism refuses dropout "
                "(its ring never forms whole rows of attention probabilities to drop, and "
                "no rank draws the masks one device would for its tokens), rather than "
                "train a different model; use dropout=0.0 with cp > 1")
    # a schedule that names a pipeline shape is checked against pp first: its message then
    # speaks of what the user asked for, not of the placement it implies
    check_schedule_fits_pipeline(schedule, pp)
    if pipeline_layout is not None:
        layout_stages(pipeline_layout, cfg.n_layer, pp, virtual_stages)  # every layer once
    elif cfg.n_layer % (pp * virtual_stages):
        raise ValueError(
            f"n_layer={cfg.n_layer} is not divisible by pp*virtual_stages={pp * virtual_stages} "
            "(for stages of unequal layers, give a pipeline_layout)")
    if virtual_stages > 1 and pp == 1:
        raise ValueError(f"virtual_stages={virtual_stages} needs a pipeline (pp > 1): interleaving "
                         "splits each pipeline rank's layers into several chunks")
    check_recompute(recompute)
    check_tp_overlap(tp_overlap, sequence_parallel, tp)
    check_zero_stage(zero_stage)
    check_param_dtype(param_dtype)
    check_expert_parallel(cfg, ep, dp, cp, tp, etp, fold)
    if cfg.n_experts:
        check_folded_slice(cfg.seq_len, tp, cp, sequence_parallel, etp, fold)
    check_placement(placement, pp, virtual_stages, zero_stage)
    check_step(schedule, microbatches, batch_size, dp=dp, pp=pp, virtual_stages=virtual_stages,
               placement=placement, tp_overlap=tp_overlap)


def check_world_size(world_size: int, *, dp: int, pp: int, cp: int, tp: int) -> None:
    """dp·pp·cp·tp ranks make the whole world: every rank has one place on the grid."""
    if dp * pp * cp * tp == world_size:
        return
    sizes = f"dp={dp}, pp={pp}, " + (f"cp={cp}, " if cp > 1 else "") + f"tp={tp}"
    product = "dp*pp*cp*tp" if cp > 1 else "dp*pp*tp"
    raise ValueError(f"{sizes}: {product} = {dp * pp * cp * tp} ranks, but world size is "
                     f"{world_size}")


def check_step(schedule, microbatches: int | None, batch_size: int | None, *, dp: int,
               pp: int, virtual_stages: int = 1, placement: str = "loop",
               tp_overlap: bool = False) -> None:
    """What one training step adds to a split model: a schedule that fits it, enough
    microbatches for that schedule, and a batch that cuts into dp slices of equal
    microbatches."""
    check_schedule(schedule, virtual_stages, placement)
    check_zero_bubble(schedule, pp, microbatches, tp_overlap)
    if microbatches is not None:
        check_positive_int("microbatches", microbatches)
        if (virtual_stages > 1 and placement == "loop"
                and not interleaving_fits(pp, microbatches)):
            raise ValueError(f"the interleaved schedule needs microbatches ({microbatches}) "
                             f"divisible by pp ({pp}): they go through each chunk in groups of pp")
    if batch_size is not None:
        check_positive_int("batch size", batch_size)
        m = 1 if microbatches is None else microbatches
        if batch_size % (dp * m):
            raise ValueError(f"the batch of {batch_size} rows cannot be cut into dp={dp} slices "
                             f"of microbatches={m} equal microbatches")
