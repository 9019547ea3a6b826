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

Why one file: every check of one exercise sits together, in the order the
learner meets them, so that a learner reading why a check failed finds all of
that exercise's expectations on one page.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...model import Block, GPTConfig
from ...runtime import trace
from ._parts import Measure, exception_check, grade_in_parts, ops_since, run_parts
from .base import Check

WORLD_SIZES = (2, 4)
TOLERANCE = 1e-10  # float64
BATCH, SEQ = 2, 6
CONFIG = dict(vocab_size=16, seq_len=SEQ, n_layer=1, n_head=4, d_model=16, dropout=0.0)
# The learner's parameter names -> (the dense module's parameter, the dim it is split
# along on this rank, or None for a whole copy).
MLP_PARAMS = {"fc_weight": ("fc.weight", 0), "fc_bias": ("fc.bias", 0),
              "proj_weight": ("proj.weight", 1), "proj_bias": ("proj.bias", None)}
ATTENTION_PARAMS = {"qkv_weight": ("qkv.weight", 0), "qkv_bias": ("qkv.bias", 0),
                    "proj_weight": ("proj.weight", 1), "proj_bias": ("proj.bias", None)}
BLOCK_PARAMS = {
    "ln1.weight": ("ln1.weight", None), "ln1.bias": ("ln1.bias", None),
    "ln2.weight": ("ln2.weight", None), "ln2.bias": ("ln2.bias", None),
    **{f"attn.{k}": (f"attn.{v}", d) for k, (v, d) in ATTENTION_PARAMS.items()},
    **{f"mlp.{k}": (f"mlp.{v}", d) for k, (v, d) in MLP_PARAMS.items()},
}
NAMES = ("ParallelMLP", "ParallelAttention", "ParallelBlock")
TITLES = {
    "mlp": "ParallelMLP equals the block's MLP: output, input and parameter gradients",
    "attention": "ParallelAttention equals the block's attention: output and every gradient",
    "block": "ParallelBlock equals minitp.model.Block: output and input gradient",
    "params": "ParallelBlock: every parameter gradient (LayerNorms whole, the rest shards)",
    "trace": "the trace: 1 all-reduce forward + 1 backward per half, 2 + 2 per block",
}
EXPECTED_OPS = {"mlp": (1, 1), "attention": (1, 1), "block": (2, 2)}


# --------------------------------------------------------------------------- in the ranks
def _dense_block() -> Block:
    torch.manual_seed(0)  # the same block on every rank
    block = Block(GPTConfig(**CONFIG)).double()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in block.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            if name.startswith("ln") and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)
    return block


def _inputs():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, SEQ, CONFIG["d_model"], generator=generator, dtype=torch.float64)
    upstream = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    return x, upstream


def _expected_grads(dense_module, table, axis) -> dict:
    """The learner's parameter name -> this rank's share of the dense gradient."""
    dense = dict(dense_module.named_parameters())
    out = {}
    for name, (dense_name, dim) in table.items():
        want = dense[dense_name].grad
        out[name] = want if dim is None else want.chunk(axis.size, dim=dim)[axis.rank]
    return out


def _check_shapes(m: Measure, module, expected: dict, who: str) -> bool:
    """Before running anything: every parameter there, with this rank's shard's shape."""
    mine = dict(module.named_parameters())
    for name, want in expected.items():
        if name not in mine:
            m.problem = f"{who} has no parameter {name}"
            m.mistakes.append("names")
            return False
        if mine[name].shape != want.shape:
            m.problem = (f"{who}.{name} has shape {tuple(mine[name].shape)}, expected "
                         f"{tuple(want.shape)}")
            m.mistakes.append("shape")
            return False
    return True


def _compare_grads(m: Measure, module, expected: dict, who: str) -> None:
    mine = dict(module.named_parameters())
    for name, want in expected.items():
        m.compare(f"gradient of {who}.{name}", mine[name].grad, want)


def _run_half(ns, axis, half: str):
    m = Measure()
    block = _dense_block()
    dense = getattr(block, "mlp" if half == "mlp" else "attn")
    x_full, upstream = _inputs()
    x_dense = x_full.clone().requires_grad_(True)
    expected = dense(x_dense)
    expected.backward(upstream)
    cls = ns["ParallelMLP" if half == "mlp" else "ParallelAttention"]
    who = cls.__name__
    module = cls(dense, axis)
    grads = _expected_grads(dense, MLP_PARAMS if half == "mlp" else ATTENTION_PARAMS, axis)
    if not _check_shapes(m, module, grads, who):
        return {**m.result(None)}
    x = x_full.clone().requires_grad_(True)
    start = len(trace.events())
    y = module(x)
    fwd = ops_since(start)
    m.compare("output", y, expected.detach())
    output_right = "output" in m.errors and m.errors["output"] <= TOLERANCE
    if isinstance(y, torch.Tensor) and y.shape == expected.shape and not output_right:
        _diagnose_output(m, y.detach(), expected.detach(), dense, x_full, axis, half)
    start = len(trace.events())
    if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == expected.shape:
        y.backward(upstream)
    bwd = ops_since(start)
    m.compare("dL/dx", x.grad, x_dense.grad)
    if output_right and m.errors.get("dL/dx", 0.0) > TOLERANCE:
        m.mistakes.append("input-grad")
    _compare_grads(m, module, grads, who)
    return m.result((fwd, bwd))


def _diagnose_output(m, y, expected, dense, x, axis, half) -> None:
    t = axis.size
    bias = dense.proj.bias.detach()
    if (y - (expected + (t - 1) * bias)).abs().max() <= TOLERANCE:
        m.mistakes.append("bias-before-sum")
    elif (y - (expected - bias)).abs().max() <= TOLERANCE:
        m.mistakes.append("bias-missing")
    elif half == "attention" and (y - _attention_qkv_first(dense, x, t)).abs().max() <= 1e-8:
        m.mistakes.append("qkv-layout")


def _attention_qkv_first(attn, x, t):
    """What the sharded attention gives if q, k, v are read as (q/k/v, head, head_dim):
    every rank's shard computed here, summed, without communication."""
    B, T, _ = x.shape
    heads = attn.n_head // t
    total = attn.proj.bias.detach().clone()
    for r in range(t):
        w = attn.qkv.weight.detach().chunk(t, 0)[r]
        b = attn.qkv.bias.detach().chunk(t)[r]
        qkv = F.linear(x, w, b).view(B, T, 3, heads, attn.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, heads * attn.head_dim)
        total = total + F.linear(y, attn.proj.weight.detach().chunk(t, 1)[r])
    return total


def _part_mlp(ns, axis):
    return _run_half(ns, axis, "mlp")


def _part_attention(ns, axis):
    return _run_half(ns, axis, "attention")


def _part_block(ns, axis):
    m, p = Measure(), Measure()
    block = _dense_block()
    x_full, upstream = _inputs()
    x_dense = x_full.clone().requires_grad_(True)
    expected = block(x_dense)
    expected.backward(upstream)
    module = ns["ParallelBlock"](block, axis)
    grads = _expected_grads(block, BLOCK_PARAMS, axis)
    if not _check_shapes(p, module, grads, "ParallelBlock"):
        m.problem, m.mistakes = p.problem, p.mistakes
        return {"block": m.result(None), "params": p.result(None)}
    x = x_full.clone().requires_grad_(True)
    start = len(trace.events())
    y = module(x)
    fwd = ops_since(start)
    m.compare("output", y, expected.detach())
    start = len(trace.events())
    if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == expected.shape:
        y.backward(upstream)
    bwd = ops_since(start)
    m.compare("dL/dx", x.grad, x_dense.grad)
    _compare_grads(p, module, grads, "ParallelBlock")
    return {"block": m.result((fwd, bwd)), "params": p.result((fwd, bwd))}


PART_FUNCTIONS = {"mlp": _part_mlp, "attention": _part_attention, "block": _part_block}


def _in_rank(ns: dict) -> dict:
    results = run_parts(PART_FUNCTIONS, ns)
    block = results.pop("block")
    if "exception" in block:
        results["block"] = results["params"] = block
    else:
        results.update(block)
    return results


# --------------------------------------------------------------------------- in the parent
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
    worst = 0.0
    for t, per_rank in outcomes:
        for rank, results in enumerate(per_rank):
            res = results[part]
            if "exception" in res:
                return exception_check(name, t, rank, res["exception"],
                                       _exception_hint(res["exception"]))
            if res["problem"]:
                return Check(name, False, f"t={t}, rank {rank}: {res['problem']}", rank=rank,
                             hint=_hint(part, res["mistakes"]))
            for tensor, error in res["errors"].items():
                if error > TOLERANCE:
                    return Check(name, False, f"t={t}, rank {rank}: {tensor} is off by up to "
                                 f"{error:.3g}", rank=rank, tensor=tensor, max_error=error,
                                 hint=_hint(part, res["mistakes"]))
                worst = max(worst, error)
    sizes = " and ".join(str(t) for t, _ in outcomes)
    return Check(name, True, f"t = {sizes}: largest error {worst:.1e}", max_error=worst)


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
