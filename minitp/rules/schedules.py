"""The pipeline schedules' rules, beside `minitp.rules` (which re-exports them): the names,
what each one needs of the model and the run, and the trace labels of their units. No
torch and no other import, so the calculator may read them.

A schedule orders four kinds of unit on a rank (`minitp.pipeline.schedules`): "F" a
forward; "B" a backward — the whole backward, unless the order also holds a "W" for the
same (chunk, microbatch), and then only the input gradient; "W" the weight gradients B
left for later (Qi et al. 2024, "Zero Bubble Pipeline Parallelism").
"""

from __future__ import annotations

import re

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev")
# the schedules that split the backward into B and W (`minitp.tensor_parallel.weight_grad`)
ZERO_BUBBLE_SCHEDULES = ("zb-h1", "zb-h2", "zbv", "dualpipev")
# the schedules whose two chunks per rank sit in a V (placement "v", below)
V_SCHEDULES = ("zbv", "dualpipev")
UNIT_KINDS = ("F", "B", "W")

# Where the pp·v stages of a pipeline live (stage g runs layers g·L/(pp·v) ...).
# "loop": rank r holds stages r, r+pp, r+2pp, ... (Megatron-LM's round-robin, v chunks).
# "v":    rank r holds stages r and 2pp−1−r (two chunks): the forward runs down the
#         ranks and back up, so the first and the last stage share rank 0 and the two
#         middle stages rank pp−1, which hands its activation to itself (Qi et al. 2024,
#         ZB-V; DeepSeek's DualPipeV).
PLACEMENTS = ("loop", "v")


def model_placement(model) -> str:
    """Where a model's pipeline chunks sit ("loop" unless it was built with placement="v")."""
    return getattr(model, "placement", "loop")


def model_chunks(model) -> list:
    """The stages this rank's model holds: a pipeline's chunks (one per virtual stage),
    or the model itself when it is a single stage (no pipeline, or the plain GPT)."""
    return list(getattr(model, "chunks", [model]))


def placement_of(schedule) -> str:
    """The placement a named schedule runs on ("loop" for a function or None)."""
    return "v" if schedule in V_SCHEDULES else "loop"


def stage_of(pp: int, rank: int, chunk: int, placement: str = "loop") -> int:
    """The stage that chunk `chunk` of pipeline rank `rank` runs."""
    if placement == "v":
        return rank if chunk == 0 else 2 * pp - 1 - rank
    return chunk * pp + rank


def rank_and_chunk(pp: int, stage: int, placement: str = "loop") -> tuple[int, int]:
    """Which pipeline rank runs `stage`, as its which chunk (`stage_of` inverted)."""
    if placement == "v":
        return (stage, 0) if stage < pp else (2 * pp - 1 - stage, 1)
    return stage % pp, stage // pp


def check_placement(placement: str, pp: int, virtual_stages: int, zero_stage: int = 0) -> None:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if placement == "v" and (pp < 2 or virtual_stages != 2):
        raise ValueError(f"placement 'v' puts two chunks on each of pp ≥ 2 ranks: it needs "
                         f"virtual_stages=2 and pp > 1 (got virtual_stages={virtual_stages}, "
                         f"pp={pp})")
    if placement == "v" and zero_stage >= 2:
        raise ValueError(f"placement 'v' with zero_stage={zero_stage}: its two copies of the "
                         "tied embedding sit on one rank, which ZeRO-2/3's sharded gradients "
                         "do not sum; use zero_stage 0 or 1")


def check_schedule_fits_pipeline(schedule, pp: int) -> None:
    """A schedule whose order is a V runs over two chunks on each of pp ≥ 2 ranks: with one
    pipeline rank there is no V (the other schedules run at pp = 1 as plain microbatching)."""
    if schedule in V_SCHEDULES and pp < 2:
        raise ValueError(f"schedule {schedule!r} needs a pipeline of pp >= 2 ranks (got pp={pp}): "
                         "its forward runs down the ranks and back up, a V")


def check_schedule(schedule, virtual_stages: int = 1, placement: str = "loop") -> None:
    """A known schedule name (or None: the default for the model), and one that fits
    the model: 'interleaved' with virtual stages placed in a loop, 'zbv' and
    'dualpipev' with two chunks placed in a V, the others with one chunk per rank."""
    if schedule is not None and not callable(schedule) and schedule not in SCHEDULE_NAMES:
        raise ValueError(f"schedule must be one of {SCHEDULE_NAMES} (or None), got {schedule!r}")
    if not isinstance(schedule, str):
        return
    if schedule in V_SCHEDULES:
        if placement != "v":
            raise ValueError(f"schedule {schedule!r} runs two chunks per rank placed in a V: "
                             "build the model with virtual_stages=2, placement='v'")
    elif placement == "v":
        raise ValueError(f"schedule {schedule!r} does not fit placement 'v': use one of "
                         f"{V_SCHEDULES}")
    elif (schedule == "interleaved") != (virtual_stages > 1):
        raise ValueError(f"schedule {schedule!r} does not fit virtual_stages={virtual_stages}: "
                         "'interleaved' needs virtual_stages > 1, the other schedules 1")


# The fewest microbatches each schedule reaches its steady state with: (how many, why).
# ZB-H2 and ZBV: the first stage (rank 0) runs 2p−1 forwards before the first backward
# arrives; DualPipeV's warm-up sends 2p into the V (deepseek-ai/DualPipe,
# dualpipe/dualpipev.py, `step`: num_chunks >= num_ranks * 2).
_MINIMUM_MICROBATCHES = {
    "zb-h2": (lambda pp: 2 * pp - 1, "2*pp-1", "its first stage runs that many forwards before "
              "the first backward arrives"),
    "zbv": (lambda pp: 2 * pp - 1, "2*pp-1", "rank 0 runs that many forwards down the V "
            "before the first backward comes back"),
    "dualpipev": (lambda pp: 2 * pp, "2*pp", "its warm-up fills the V with that many before "
                  "the steady state"),
}


def minimum_microbatches(schedule, pp: int) -> int:
    """The fewest microbatches `schedule` runs with on pp ranks (1 if it has no minimum)."""
    rule = _MINIMUM_MICROBATCHES.get(schedule)
    return rule[0](pp) if rule else 1


def check_microbatches(schedule, pp: int, microbatches: int | None) -> None:
    """A ValueError in one line if `schedule` needs more microbatches than given."""
    rule = _MINIMUM_MICROBATCHES.get(schedule)
    if rule is None or microbatches is None or microbatches >= rule[0](pp):
        return
    least, formula, why = rule
    raise ValueError(f"schedule {schedule!r} needs microbatches >= {formula} = {least(pp)} "
                     f"(got {microbatches}): {why}")


def check_zero_bubble(schedule, pp: int, microbatches: int | None,
                      tp_overlap: bool) -> None:
    """What a B/W-split schedule needs: the layers' weight gradients deferred by the
    linear layers themselves (ZeRO-2 reduces whatever has arrived, which adds up:
    `ShardedGradSync`; ZeRO-3's W reduces its unit's weight gradients on its own:
    `minitp.tensor_parallel.weight_grad`; not the overlapped tensor-parallel GEMMs, which
    compute them inside their own backward), and ZB-H2, ZBV and DualPipeV their microbatches."""
    if schedule not in ZERO_BUBBLE_SCHEDULES:
        return
    if tp_overlap:
        raise ValueError(f"schedule {schedule!r} with tp_overlap: the overlapped GEMMs "
                         "compute their weight gradients inside B; use tp_overlap=False")
    check_microbatches(schedule, pp, microbatches)


def default_schedule(virtual_stages: int = 1, placement: str = "loop") -> str:
    if placement == "v":
        return "zbv"
    return "interleaved" if virtual_stages > 1 else "1f1b"


def interleaving_fits(pp: int, microbatches: int) -> bool:
    """The interleaved schedule sends microbatches through each chunk in groups of
    pp (Megatron-LM's order), so it needs microbatches divisible by pp."""
    return microbatches % pp == 0


# --------------------------------------------------------------------------- trace labels
_UNIT = re.compile(r"^([FBW])(\d+)(?::(\d+))?$")


def unit_label(kind: str, microbatch: int, chunk: int = 0, virtual_stages: int = 1) -> str:
    """A pipeline unit's trace label: "F3" is the forward of microbatch 3, "B3" its
    backward, "W3" its deferred weight gradients; with virtual stages, "F3:1" runs it
    through this rank's chunk 1."""
    if kind not in UNIT_KINDS:
        raise ValueError(f"a pipeline unit is one of {UNIT_KINDS}, got {kind!r}")
    return f"{kind}{microbatch}" + (f":{chunk}" if virtual_stages > 1 else "")


def parse_unit_label(label: str) -> tuple[str, int, int] | None:
    """(kind, microbatch, chunk) of a label made by `unit_label`, or None."""
    found = _UNIT.match(label or "")
    if not found:
        return None
    return found[1], int(found[2]), int(found[3] or 0)
