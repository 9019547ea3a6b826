"""Checks for ex02: f and g, and the column- and row-parallel linear layers.

At t = 2, 3 and 4 ranks, in float64, against dense references that every rank
computes by itself from seeded inputs (so the reference uses no communication
and none of the learner's code):

1. f alone: identity forward, the sum of every rank's gradient backward;
2. g alone: the sum of every rank's input forward, the gradient unchanged backward;
3. the column-parallel layer: its output slice, dL/dX, its weight and bias shards' gradients;
4. the row-parallel layer: the output (bias added once), dL/dX_r, the weight shard's
   and the whole bias's gradients;
5. column → GELU → row equals the dense two-layer MLP, output and every gradient;
6. the trace: exactly the collectives Megatron's layers need (f: one all-reduce
   backward; g: one forward; the MLP: one each way), and nothing else.

A failure names t, the rank, the tensor and the largest error, with a hint aimed
at the usual mistakes (an all-reduce in f's forward, none in its backward, the
bias added before the reduction, an all-reduce in g's backward).

The parts run on the ranks in ex02_rank.py; this module judges what they found.
"""

from __future__ import annotations

from ._parts import grade_in_parts, judge_numbers
from .base import Check
from .ex02_rank import TOLERANCE, _in_rank

WORLD_SIZES = (2, 3, 4)
NAMES = ("CopyToParallel", "ReduceFromParallel", "column_parallel_linear",
         "row_parallel_linear")
PARTS = ("f", "g", "column", "row", "mlp")
TITLES = {
    "f": "f (CopyToParallel): identity forward, all-reduce backward",
    "g": "g (ReduceFromParallel): all-reduce forward, identity backward",
    "column": "column-parallel layer: output slice, input, weight and bias gradients",
    "row": "row-parallel layer: output (bias once), input, weight and bias gradients",
    "mlp": "column -> GELU -> row equals the dense MLP, forward and backward",
    "trace": "the trace: only the all-reduces f and g need (MLP: 1 forward, 1 backward)",
}
# The collectives each part may record: (forward ops, backward ops).
EXPECTED_OPS = {
    "f": ([], ["all_reduce"]),
    "g": (["all_reduce"], []),
    "column": ([], ["all_reduce"]),
    "row": (["all_reduce"], []),
    "mlp": (["all_reduce"], ["all_reduce"]),
}
PART_NAMES = {"f": "f", "g": "g", "column": "the column-parallel layer",
              "row": "the row-parallel layer", "mlp": "the MLP"}


HINTS = {
    "f-forward-sums": "f's forward must be the identity: every rank already holds all of X. "
                      "The all-reduce belongs in f's backward.",
    "f-backward-identity": "each rank's branch holds only part of dL/dX (its own columns' "
                           "contribution): f's backward must all-reduce the gradient.",
    "g-forward-identity": "g's forward must sum the ranks' partial products: "
                          "mt.comm.all_reduce(x, axis).",
    "g-backward-sums": "g's backward is the identity: dL/dY is already the same on every "
                       "rank, and d(sum)/d(term) = 1. All-reducing it multiplies it by t.",
    "bias-before-sum": "the bias was added before the reduction, so the all-reduce counted it "
                       "t times: add it once, after g.",
    "bias-missing": "the output is short by exactly the bias: add it, once, after g.",
    "bias-not-every-rank": "add the whole bias on every rank, after g: then every rank's copy "
                           "gets the same gradient and stays the same.",
}
GENERIC_HINTS = {
    "f": "forward: return x unchanged; backward: return (mt.comm.all_reduce(grad, ctx.axis), "
         "None).",
    "g": "forward: return mt.comm.all_reduce(x, axis); backward: return (grad, None).",
    "column": "Y_r = F.linear(f(x), weight, bias), with f = copy_to_parallel.",
    "row": "Y = g(F.linear(x, weight)) + bias, with g = reduce_from_parallel.",
    "mlp": "get the column and row layers right first (see above): the MLP only composes "
           "them, with GELU in between and no communication of its own.",
}


def _hint(part, mistakes) -> str:
    return next((HINTS[k] for k in mistakes), GENERIC_HINTS[part])


def _judge_numbers(part, name, outcomes) -> Check:
    return judge_numbers(part, name, outcomes, TOLERANCE, _hint)


def _judge_trace(name, outcomes) -> Check:
    for t, per_rank in outcomes:
        for rank, results in enumerate(per_rank):
            for part in PARTS:
                res = results[part]
                if "exception" in res:
                    return Check(name, False, f"not checked: {PART_NAMES[part]} raised an "
                                 f"error (see above)", rank=rank)
                for phase, got, want in zip(("forward", "backward"), res["ops"],
                                            EXPECTED_OPS[part], strict=True):
                    if got == want:
                        continue
                    said = ", ".join(op.replace("_", "-") for op in got) or "nothing"
                    expected = ", ".join(op.replace("_", "-") for op in want) or "nothing"
                    numbers_ok = not res["problem"] and all(
                        e <= TOLERANCE for e in res["errors"].values())
                    return Check(name, False, f"t={t}, rank {rank}: {PARTS_LABEL[part]} "
                                 f"{phase} recorded {said}; expected {expected}", rank=rank,
                                 hint=_trace_hint(part, phase, got, want, numbers_ok))
    return Check(name, True, "f: 1 all-reduce backward, g: 1 forward, MLP: 1 + 1, on every rank")


PARTS_LABEL = {"f": "f's", "g": "g's", "column": "the column layer's",
               "row": "the row layer's", "mlp": "the MLP's"}


def _trace_hint(part, phase, got, want, numbers_ok) -> str:
    if not got and numbers_ok:
        return ("no collective was recorded: communicate through mt.comm.all_reduce (it "
                "leaves an event in the trace; torch.distributed called directly does not)")
    if not got:
        return HINTS["f-backward-identity" if phase == "backward" else "g-forward-identity"]
    if any(op != "all_reduce" for op in got):
        return "f and g need nothing but mt.comm.all_reduce"
    if part in ("f", "column") and phase == "forward":
        return HINTS["f-forward-sums"]
    if part in ("g", "row") and phase == "backward":
        return HINTS["g-backward-sums"]
    if len(got) > len(want):
        return "one all-reduce per mapping and pass: the layers only call f or g once each"
    return GENERIC_HINTS[part]


def run(module) -> list[Check]:
    return grade_in_parts(module, NAMES, TITLES, WORLD_SIZES, _in_rank, _judge_numbers,
                          _judge_trace)
