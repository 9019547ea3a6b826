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

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")
# the schedules that split the backward into B and W (`minitp.weight_grad`)
ZERO_BUBBLE_SCHEDULES = ("zb-h1", "zb-h2")
UNIT_KINDS = ("F", "B", "W")


def check_schedule(schedule, virtual_stages: int = 1) -> None:
    """A known schedule name (or None: the default for `virtual_stages`), and one
    that fits the model: 'interleaved' exactly when there are virtual stages."""
    if schedule is not None and not callable(schedule) and schedule not in SCHEDULE_NAMES:
        raise ValueError(f"schedule must be one of {SCHEDULE_NAMES} (or None), got {schedule!r}")
    if isinstance(schedule, str) and (schedule == "interleaved") != (virtual_stages > 1):
        raise ValueError(f"schedule {schedule!r} does not fit virtual_stages={virtual_stages}: "
                         "'interleaved' needs virtual_stages > 1, the other schedules 1")


def zb_h2_microbatches(pp: int) -> int:
    """ZB-H2 fills the warm-up with 2·pp − 1 forwards on the first stage: it needs at
    least that many microbatches to reach its steady state without bubbles."""
    return 2 * pp - 1


def check_zero_bubble(schedule, pp: int, microbatches: int | None, zero_stage: int,
                      tp_overlap: bool) -> None:
    """What a B/W-split schedule needs: the layers' weight gradients deferred by the
    linear layers themselves (not by ZeRO-2/3's per-unit reduce-scatters nor by the
    overlapped tensor-parallel GEMMs, which compute them inside their own backward), and
    ZB-H2 its microbatches."""
    if schedule not in ZERO_BUBBLE_SCHEDULES:
        return
    if zero_stage >= 2:
        raise ValueError(f"schedule {schedule!r} with zero_stage={zero_stage}: ZeRO-2/3 "
                         "reduce-scatter a unit's gradients as soon as backward has made them, "
                         "before a deferred W; use zero_stage 0 or 1")
    if tp_overlap:
        raise ValueError(f"schedule {schedule!r} with tp_overlap: the overlapped GEMMs "
                         "compute their weight gradients inside B; use tp_overlap=False")
    if schedule == "zb-h2" and microbatches is not None and microbatches < zb_h2_microbatches(pp):
        raise ValueError(f"schedule 'zb-h2' needs microbatches >= 2*pp-1 = "
                         f"{zb_h2_microbatches(pp)} (got {microbatches}): its first stage "
                         "runs that many forwards before the first backward arrives")


def default_schedule(virtual_stages: int = 1) -> str:
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
