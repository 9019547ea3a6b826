"""ex03 on the ranks: the learner's ParallelMLP, ParallelAttention and ParallelBlock
against the plain `minitp.model.Block` every rank builds from the same seed, their
numbers, the usual mistakes they match and their collectives recorded for the parent
(ex03.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...model import Block, GPTConfig
from ...runtime import trace
from ._parts import Measure, ops_since, run_parts

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
