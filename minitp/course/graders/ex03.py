"""Checks for ex03: a tensor-parallel transformer block from weight shards and f / g.

At t = 2 and 4 ranks, in float64, against the plain `minitp.model.Block` that
every rank builds from the same seed (its LayerNorm and bias values randomised,
so that a bias added twice or a LayerNorm left out cannot hide):

1. the learner's `ParallelMLP` equals the block's MLP: output, dL/dx, and each
   parameter's gradient equal to this rank's shard of the dense gradient;
2. `ParallelAttention` equals the block's attention, the same way;
3. `ParallelBlock` (the given composition) equals the Block: output and dL/dx;
4. every parameter gradient of `ParallelBlock`: replicated LayerNorms equal to the
   dense ones, shards equal to the dense gradient's shard;
5. the trace: one all-reduce forward and one backward in each half, so 2 + 2 per block.

The parts run on the ranks in ex03_rank.py; this module judges what they found.
"""

from __future__ import annotations

from ._parts import grade_in_parts, judge_numbers
from .base import Check
from .ex03_rank import TOLERANCE, _in_rank

WORLD_SIZES = (2, 4)
NAMES = ("ParallelMLP", "ParallelAttention", "ParallelBlock")
TITLES = {
    "mlp": "ParallelMLP equals the block's MLP: output, input and parameter gradients",
    "attention": "ParallelAttention equals the block's attention: output and every gradient",
    "block": "ParallelBlock equals minitp.model.Block: output and input gradient",
    "params": "ParallelBlock: every parameter gradient (LayerNorms whole, the rest shards)",
    "trace": "the trace: 1 all-reduce forward + 1 backward per half, 2 + 2 per block",
}
EXPECTED_OPS = {"mlp": (1, 1), "attention": (1, 1), "block": (2, 2)}


HINTS = {
    "bias-before-sum": "proj's bias was added before g, so the all-reduce counted it t "
                       "times: add it once, after g.",
    "bias-missing": "the output is short by exactly proj's bias: add it once, after g.",
    "qkv-layout": "q, k and v were read as (q/k/v, head, head_dim), but the features are "
                  "ordered (head, q/k/v, head_dim): view qkv as (B, T, n_head, 3, head_dim).",
    "input-grad": "the output is right but dL/dx is not: each rank's branch gives only its "
                  "part of dL/dx, so the half must start with f "
                  "(mt.mappings.copy_to_parallel), whose backward all-reduces.",
    "names": "keep the parameter names of the exercise file (fc_weight, fc_bias, proj_weight, "
             "proj_bias; qkv_weight, qkv_bias, proj_weight, proj_bias): the grader reads the "
             "gradients from them.",
}
SHAPE_HINT = ("nn.Linear's weight is (out_features, in_features): a column-parallel layer "
              "keeps its block of the output features (weight dim 0, and its bias with it), a "
              "row-parallel one its block of the input features (weight dim 1) and the whole "
              "bias.")
GENERIC_HINTS = {
    "mlp": "f, fc (its columns) with its bias shard, GELU, proj (its rows) without bias, g, "
           "then + proj_bias.",
    "attention": "f; qkv with this rank's rows; view (B, T, self.n_head, 3, head_dim) with "
                 "self.n_head the heads of this rank; attention per head; proj (its rows); g; "
                 "+ proj_bias.",
    "block": "get ParallelMLP and ParallelAttention right first (see above): ParallelBlock "
             "only composes them with the replicated LayerNorms.",
    "params": "get ParallelMLP and ParallelAttention right first (see above).",
}


def _hint(part, mistakes) -> str:
    for mistake in mistakes:
        if mistake == "shape":
            return SHAPE_HINT
        if mistake in HINTS:
            return HINTS[mistake]
    return GENERIC_HINTS[part]


def _exception_hint(info) -> str:
    if "invalid for input of size" in info["message"]:
        return ("this rank holds n_head/t heads (self.n_head), so its qkv output is "
                "(B, T, 3 * self.n_head * head_dim): view it with self.n_head, not the "
                "model's n_head")
    return ""


def _judge(part, name, outcomes) -> Check:
    return judge_numbers(part, name, outcomes, TOLERANCE, _hint, _exception_hint,
                         joiner=" and ")


def _judge_trace(name, outcomes) -> Check:
    for t, per_rank in outcomes:
        for rank, results in enumerate(per_rank):
            for part, (n_fwd, n_bwd) in EXPECTED_OPS.items():
                res = results[part]
                if "exception" in res or res["ops"] is None:
                    return Check(name, False, f"not checked: {part} did not run (see above)",
                                 rank=rank)
                for phase, got, want in zip(("forward", "backward"), res["ops"],
                                            (n_fwd, n_bwd), strict=True):
                    if got == ["all_reduce"] * want:
                        continue
                    said = ", ".join(op.replace("_", "-") for op in got) or "nothing"
                    return Check(name, False, f"t={t}, rank {rank}: {part} {phase} recorded "
                                 f"{said}; expected {want} all-reduce{'s' * (want > 1)}",
                                 rank=rank, hint=_trace_hint(phase, got, want))
    return Check(name, True, "each half: 1 all-reduce forward, 1 backward; the block: 2 + 2")


def _trace_hint(phase, got, want) -> str:
    if any(op != "all_reduce" for op in got):
        return ("without sequence parallelism a block needs only all-reduces: f and g from "
                "mt.mappings (an all-gather means an output was gathered that need not be)")
    if len(got) > want:
        return ("one f and one g per half: no communication between the column-parallel "
                "and the row-parallel layer (GELU and attention act on this rank's shard)")
    if phase == "forward":
        return "each half ends with g (mt.mappings.reduce_from_parallel), before its bias"
    return "each half starts with f (mt.mappings.copy_to_parallel): its backward all-reduces"


def run(module) -> list[Check]:
    return grade_in_parts(module, NAMES, TITLES, WORLD_SIZES, _in_rank, _judge, _judge_trace)
