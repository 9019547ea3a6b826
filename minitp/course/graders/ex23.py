"""Checks for ex23: the amax groups of a tensor-parallel FP8 MLP, with and without SP.

One launch of 4 ranks, a dp = 2 × tp = 2 mesh, float64. The reference is one device's
FP8 step on the whole batch, written here by hand (each cast scaled by the whole tensor's
amax, the backward's GEMMs from the casts), never the exercise's code:

* (a) `shared_amax` over dp, over tp and over both, on tensors whose largest magnitude is
  a negative entry. Named: a local scale (each rank its own amax), a sum (all_reduce's
  default op), the largest signed value, a reduction over the first axis only;
* (b) `amax_groups` for both layers with and without SP, against the rule
  (`minitp.rules.fp8_groups`, the library's, on a mesh without cp, the weights ZeRO-3's:
  split over dp too). Named: no reduction
  where the tensor is split (a local scale), a weight reduced over dp where tp splits it
  (the wrong group: Megatron-LM PR #442), a ZeRO-3 weight left without dp (lesson 23's
  table copied), SP's column input left without tp (TransformerEngine PR #74). A group
  that also spans axes holding only copies is correct (Megatron-LM's one tp × dp group):
  it passes, its cost said;
* (c) `gradient_gemms` (FP8Linear's backward), with the grader's (a) and (b) installed in
  their place, so it is judged alone: one forward and backward with and without SP, the
  output, the input's gradient and both weights' ZeRO-3 pieces against one device.
  Every `quantize` call is watched; named: the output gradient never cast (a forgotten
  backward scale), cast to e4m3, cast with this rank's own amax (a local scale) or another;
* (d) the learner's own (a), (b) and (c) together, the same step: its largest error
  measured against one device, the drift a wrong group causes.

The run on the ranks is ex23_rank.py; this module judges what it found.
"""

from __future__ import annotations

from types import SimpleNamespace

from ...runtime.launch import launch
from .base import Check, judge_parts, kept_failure, run_per_size
from .ex23_rank import AXES, E5M2, ROLES, TOLERANCE, _in_rank, rule

WORLD_SIZES = (4,)
TIMEOUT = 60.0
NAMES = ["(a) shared_amax: the largest |value| over the ranks of the given axes",
         "(b) amax_groups: the axes each cast's amax is reduced over, with and without SP",
         "(c) gradient_gemms: the output gradient cast to e5m2 with its shared scale, both "
         "GEMMs of the backward from FP8 operands",
         "(d) your (a), (b) and (c) together: the FP8 MLP on dp = 2 × tp = 2 equals one "
         "device's FP8 step"]
HINT_C = ("the gradient has a cast of its own, in its own format, with the amax of the whole "
          "gradient: quantize(grad, shared_amax(grad, axes), E5M2); then "
          "∂x = g_q W_q and ∂W = g_qᵀ x_q")



def run(module) -> list[Check]:
    fns = SimpleNamespace(shared_amax=module.shared_amax, amax_groups=module.amax_groups,
                          FP8Linear=module.FP8Linear, mlp=module.mlp,
                          gradient_gemms=module.gradient_gemms, quantize=module.quantize)
    return run_per_size(WORLD_SIZES, lambda n: list(NAMES),
                        lambda n: launch(_in_rank, n, fns, timeout=TIMEOUT), _judge,
                        what="the amax groups", size="n")


def _judge(n, names, per_rank) -> list[Check]:
    return judge_parts(names, (_judge_a, _judge_b, _judge_c, _judge_d), per_rank)


def _judge_a(record):
    a = record["a"]
    if "raised" in a:
        return kept_failure("shared_amax", a["raised"], "an amax reduced with MAX")
    for f in a["found"]:
        over, got = " and ".join(f["names"]), f["got"]
        if got is not None and abs(got - f["right"]) <= 1e-12 * f["right"]:
            continue
        mistakes = {"local": "this rank's own amax, not reduced: a local scale",
                    "sum": "the sum of the ranks' amaxes: all_reduce sums unless told "
                           "op=\"max\"", "signed": "the largest value, not the largest "
                                                   "magnitude: a negative entry is larger here",
                    "first": f"reduced over {f['names'][0]} only: reduce over every axis given"}
        why = next((says for key, says in mistakes.items()
                    if got is not None and abs(got - f[key]) <= 1e-12 * abs(f[key])),
                   f"got {got}, the whole tensor's amax is {f['right']}")
        return False, f"over {over}: {why}", "the largest |value| of every rank's piece: " \
            "t.abs().max(), then all_reduce(..., op=\"max\") over each axis"
    return True, "over dp, tp and both: the largest magnitude of every rank's piece", ""


def _judge_b(record):
    larger = []  # correct groups wider than needed: the same scales, a costlier all-reduce
    for (layer, sp), got in record["b"].items():
        if "raised" in got:
            return kept_failure("amax_groups", got["raised"], "which axes split each tensor?")
        want = rule(layer, sp)
        for role in ROLES:
            mine, right = got[role], want[role]
            where = f"{layer} layer{', SP' if sp else ''}, {role}: {mine}, expected {right}"
            missing = [a for a in right if a not in mine]
            extra = [a for a in mine if a not in right]
            if any(a not in AXES for a in mine):
                return False, f"{where}: the axes are named 'dp' and 'tp'", \
                    "name the axes that split the tensor"
            if not missing:  # every rank holding a piece is in; the rest hold copies
                larger += [f"{layer}{' (SP)' if sp else ''} {role} over {', '.join(extra)}"] \
                    if extra else []
                continue
            if role == "weight" and "tp" in missing:
                return False, f"{where}: the wrong group — tp splits the weight, and the " \
                    "tp ranks would scale their pieces apart (Megatron-LM PR #442 reduced " \
                    "over the data-parallel group only: its FP8 runs of a 40B model at " \
                    "tp = 8 diverged after about 1,000 iterations)", "which axis holds the " \
                    "other pieces of W?"
            if not mine:
                return False, f"{where}: a local scale — every rank of {right} holds another " \
                    "piece and would scale it by its own amax", "a split tensor shares one amax"
            if role == "weight":
                return False, f"{where}: dp holds other pieces of it here — ZeRO-3 keeps 1/dp " \
                    "of the weight's rows on each dp rank and casts them before the gather, so " \
                    "the gather can move 8 bits (lesson 23's table is for a weight whole on " \
                    "every dp rank)", "what does each dp rank hold of W when its cast runs?"
            if sp and role == "input" and layer == "column":
                return False, f"{where}: under SP the input is cast on this rank's sequence " \
                    "shard, before the all-gather (TransformerEngine PR #74)", "who holds the " \
                    "other positions of the sequence?"
            return False, f"{where}: {', '.join(missing)} holds other pieces of it", \
                "the data-parallel ranks hold other rows of every activation and gradient"
    said = "both layers, with and without SP: every rank holding a piece is in each group"
    if not larger:
        return True, said + ", no more", ""
    return True, f"{said}. Correct, and larger than needed: {'; '.join(larger)} — those " \
        "ranks hold copies, so the scales are the same (Megatron-LM's one group over tp × dp " \
        "for every tensor trains equal to one device too), but each such amax is a " \
        "one-number all-reduce over 4 ranks where 2 suffice: more hops of latency each " \
        "step, no bytes worth counting", ""


def _judge_c(record):
    for sp, run_ in record["c"].items():
        label = "with SP" if sp else "without SP"
        if "raised" in run_:
            return kept_failure("gradient_gemms", run_["raised"], HINT_C)
        casts = [entry for entry in run_["log"] if entry[0] == "bwd"]
        if not casts:
            return False, f"{label}: the output gradient was never cast: the backward scale " \
                "is forgotten (the backward GEMMs read it in full precision)", HINT_C
        for (_, dtype, amax, local), layer in zip(casts, ("row", "column"), strict=False):
            whole = run_["amax"][layer]
            if dtype != E5M2:
                return False, f"{label}: the {layer} layer's gradient cast to {dtype}: " \
                    "this exercise's recipe (the classic one, TransformerEngine's HYBRID) " \
                    "casts gradients to e5m2, for the range", HINT_C
            if abs(amax - whole) > 1e-12 * whole:
                why = ("this rank's own amax, a local scale" if abs(amax - local) <= 1e-12 *
                       local else f"amax {amax:.6g}")
                return False, f"{label}: the {layer} layer's gradient scaled by {why}; the " \
                    f"whole gradient's amax is {whole:.6g}", HINT_C
        tensor, error = max(run_["errors"].items(), key=lambda item: item[1])
        if error > TOLERANCE:
            return False, f"{label}: the {tensor} is off by {error:.3g} (relative) though " \
                "every cast was right: the GEMMs", HINT_C
    return True, "with and without SP, every output and gradient as one device's", ""


def _judge_d(record):
    worst = {}
    for sp, run_ in record["d"].items():
        label = "with SP" if sp else "without SP"
        if "raised" in run_:
            said = kept_failure('your MLP', run_['raised'], '')[1]
            return False, f"not checked: {label}, {said}", "write (a), (b) and (c) first"
        tensor, worst[label] = max(run_["errors"].items(), key=lambda item: item[1])
        if worst[label] > TOLERANCE:
            return False, f"{label}: the {tensor} differs from one device's by " \
                f"{worst[label]:.3g} (relative): the drift of a scale not shared", \
                "see (a) and (b)"
    return True, ", ".join(f"{k} largest error {v:.1e}" for k, v in worst.items()), ""
