"""The rules every other file shares: the ground floor of minitp.

Nothing here needs torch or imports the rest of minitp but its MoE rules
(`minitp.rules.experts`): the calculator (`minitp.calc`, pure arithmetic) may import these two.
Each rule is written once, here, and every file that needs it imports it:
* what must divide what for a (dp, pp, cp, tp, ep) split — `check_parallel_config`;
* context parallelism's load-balanced chunks: which two of a sequence's 2·cp
  chunks each cp rank holds — `cp_chunks`, `check_context_split`;
* the pipeline schedule names and what each needs, and the units' trace labels
  ("F3", "B3", "W3:1": `minitp.rules.schedules`, re-exported here);
* the recompute modes and the ZeRO stages;
* the ignore index of the loss, and what a valid token id is;
* the trace's label formats ("layer3", "F3", "F3:1"), built and parsed by the
  same functions;
* the ring-algorithm byte *model* (a formula — what a ring would send — not a
  measurement).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .experts import check_expert_parallel
from .heads import check_tp_widths, kv_layout  # noqa: F401  (re-exported)
from .schedules import (  # noqa: F401  (the pipeline's rules, re-exported)
    PLACEMENTS,
    SCHEDULE_NAMES,
    V_SCHEDULES,
    ZERO_BUBBLE_SCHEDULES,
    check_microbatches,
    check_placement,
    check_schedule,
    check_zero_bubble,
    default_schedule,
    interleaving_fits,
    minimum_microbatches,
    parse_unit_label,
    placement_of,
    rank_and_chunk,
    stage_of,
    unit_label,
)
from .vision import check_vision_layout

IGNORE_INDEX = -100  # a target that contributes nothing to the loss (PyTorch's default)
# A vision-language model's image patch: 2 wide × 4 tall binary pixels, 8 bits, so exactly one
# byte id (`minitp.data.images` draws them, `minitp.model.vision` reads them, `minitp.calc` counts them)
PATCH_W, PATCH_H = 2, 4
SEQ_DIM = 1  # token ids are (batch, seq); activations (batch, seq, hidden)

RECOMPUTE_MODES = (None, "selective", "full")
# ZeRO (Rajbhandari et al. 2020) shards over the data-parallel axis: 0 nothing (plain
# data parallelism), 1 the optimizer state, 2 also the gradients, 3 also the parameters.
ZERO_STAGES = (0, 1, 2, 3)
# Parameter dtypes `parallelize` can cast to: None keeps the reference model's dtype;
# "bfloat16" is mixed precision (`minitp.mixed_precision`). float16 would need loss scaling.
PARAM_DTYPES = (None, "bfloat16")


# --------------------------------------------------------------------------- what divides what
def ceil_div(n: int, k: int) -> int:
    """⌈n / k⌉ in integers: the size of each of k equal slices that hold n (padded)."""
    return -(-n // k)


def round_up(n: int, k: int) -> int:
    """n rounded up to a multiple of k: what a flat vector or a vocabulary is padded to
    so that k ranks hold equal slices (collectives need equal shapes)."""
    return ceil_div(n, k) * k


# --------------------------------------------------------------------------- a rank's stages
def model_placement(model) -> str:
    """Where a model's pipeline chunks sit ("loop" unless it was built with placement="v")."""
    return getattr(model, "placement", "loop")


def model_chunks(model) -> list:
    """The stages this rank's model holds: a pipeline's chunks (one per virtual stage),
    or the model itself when it is a single stage (no pipeline, or the plain GPT)."""
    return list(getattr(model, "chunks", [model]))


# --------------------------------------------------------------------------- checks
def check_positive_int(name: str, value) -> int:
    """`value`, if it is a positive int (not a bool); else a ValueError naming `name`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


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
                          placement: str = "loop", vision_layout: str = "replicated") -> None:
    """Raise a clear ValueError if the model `cfg` (a GPTConfig) cannot be split
    this way: the one validator of a parallel configuration. Call it in the parent
    with the sizes, before any process starts (the CLI, the graders, the calculator);
    `parallelize` calls it again on every rank with its `mesh` (whose axis sizes and world
    size stand for dp, pp, cp, tp, ep and world_size), and `train_step` with the schedule,
    microbatches and batch size it was given. ep: `minitp.rules.experts.check_expert_parallel`.
    placement: where the pipeline's chunks sit ("loop" or "v": `minitp.rules.schedules`).
    vision_layout: a vision-language model's encoder over tp (`minitp.rules.vision`)."""
    if mesh is not None:
        dp, pp, cp, tp = mesh.dp.size, mesh.pp.size, mesh.cp.size, mesh.tp.size
        ep, world_size = mesh.ep.size, mesh.world_size
    for name, value in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp), ("ep", ep),
                        ("virtual_stages", virtual_stages)):
        check_positive_int(name, value)
    check_tp_widths(cfg, tp)
    check_vision_layout(cfg, vision_layout, tp, cp)
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
    if cfg.n_layer % (pp * virtual_stages):
        raise ValueError(
            f"n_layer={cfg.n_layer} is not divisible by pp*virtual_stages={pp * virtual_stages}"
        )
    if virtual_stages > 1 and pp == 1:
        raise ValueError(f"virtual_stages={virtual_stages} needs a pipeline (pp > 1): interleaving "
                         "splits each pipeline rank's layers into several chunks")
    check_recompute(recompute)
    check_tp_overlap(tp_overlap, sequence_parallel, tp)
    check_zero_stage(zero_stage)
    check_param_dtype(param_dtype)
    check_expert_parallel(cfg, ep, dp, cp)
    if world_size is not None and dp * pp * cp * tp != world_size:
        if cp == 1:
            raise ValueError(f"dp*pp*tp = {dp}*{pp}*{tp} = {dp * pp * tp}, but world size is "
                             f"{world_size}")
        raise ValueError(f"dp*pp*cp*tp = {dp}*{pp}*{cp}*{tp} = {dp * pp * cp * tp}, but world "
                         f"size is {world_size}")
    check_placement(placement, pp, virtual_stages, zero_stage)
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


TOKEN_ID_DTYPE = "int64"  # token ids are torch.long, in the plain GPT and every parallel model


def check_token_ids(ids, vocab_size: int, what: str = "token id", ignore_index=None) -> None:
    """Token ids are int64 (else a TypeError), and every id is in [0, vocab_size) (or
    equal to `ignore_index`), else a ValueError naming the first bad one.

    One dtype, refused alike everywhere: torch's own rules differ by op (an embedding
    takes int32 ids, cross-entropy refuses int32 targets), so without this an int32
    batch trained in a parallel model and raised in the plain GPT. An out-of-range id
    would otherwise index a padded vocabulary row (an `inf` loss) or, on another rank,
    nothing at all (a silent, finite, wrong loss). Works on any tensor without
    importing torch here."""
    dtype = str(ids.dtype).removeprefix("torch.")
    if dtype != TOKEN_ID_DTYPE:
        raise TypeError(f"{what}s must be {TOKEN_ID_DTYPE} (torch.long), got {dtype}: "
                        "convert them with .long()")
    bad = (ids < 0) | (ids >= vocab_size)
    if ignore_index is not None:
        bad = bad & (ids != ignore_index)
    if bad.any():
        first = int(ids[bad].reshape(-1)[0])
        allowed = f"[0, {vocab_size})" + ("" if ignore_index is None
                                         else f" or the ignore index {ignore_index}")
        raise ValueError(f"{what} {first} is outside the vocabulary: it must be in {allowed}")


# --------------------------------------------------------------------------- trace labels
LAYER_LABEL = "layer{}"
_LAYER = re.compile(r"(?:^|\.)layer(\d+)(?:\.|$)")


def layer_label(index: int) -> str:
    """The trace label of transformer layer `index` (in the whole model's numbering)."""
    return LAYER_LABEL.format(index)


def parse_layer_label(label: str) -> int | None:
    """The layer a (possibly nested, dot-joined) label belongs to, or None."""
    found = _LAYER.search(label or "")
    return int(found[1]) if found else None


# --------------------------------------------------------------------------- byte model
def ring_send_fraction(op: str, n: int) -> Fraction:
    """MODEL: the fraction of the full tensor S one rank sends for `op` on a ring of
    `n` ranks: all_reduce 2(n−1)/n, all_gather and reduce_scatter (n−1)/n (the
    calculator uses it exactly; `ring_wire_bytes` rounds to whole bytes)."""
    if n < 1:
        raise ValueError(f"a ring has at least one rank, got n={n}")
    if op == "all_reduce":
        return Fraction(2 * (n - 1), n)
    if op in ("all_gather", "reduce_scatter"):
        return Fraction(n - 1, n)
    raise ValueError(f"no ring model for collective {op!r}")


def ring_wire_bytes(op: str, nbytes: int, n: int) -> int:
    """MODEL, not measurement: the bytes each rank sends for `op` on a ring of `n`
    ranks moving a tensor of `nbytes` in all (S).

    all_reduce is a reduce-scatter followed by an all-gather: each of the two
    passes sends n−1 chunks of S/n, hence 2(n−1)/n·S; all_gather and
    reduce_scatter send (n−1)/n·S. A point-to-point send moves the whole message
    once; a receive sends nothing. A broadcast is pipelined along a chain, so
    every rank but the last forwards S once: we count S, the root's share.
    Integer division: a ring's chunks are whole bytes.
    """
    if op == "send":
        return nbytes
    if op == "recv" or n <= 1:
        return 0
    if op == "broadcast":
        return nbytes
    return math.floor(nbytes * ring_send_fraction(op, n))
