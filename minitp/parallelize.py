"""Turn a plain `GPT` into this rank's tensor-parallel shard, by a plan table.

The model file has no parallel code. Parallelism is applied here, as torchtitan
applies it: a table maps module names of the plain model to what each becomes
on a rank. The shard takes its weights from the plain model, so the two compute
the same function — which the tests check, loss and every gradient.

Without sequence parallelism (Megatron-LM, Shoeybi et al. 2019), per layer::

    x ─ ln1 ─ f ─ qkv (column) ─ attention on this rank's heads ─ proj (row) ─ g ─ + x
    x ─ ln2 ─ f ─ fc  (column) ─ GELU                           ─ proj (row) ─ g ─ + x

f is identity forward / all-reduce backward, g the reverse: 2 all-reduces
forward and 2 backward per layer. With sequence parallelism (Korthikanti et al.
2022), LayerNorm, dropout and the residual stream stay split along the sequence;
each f becomes an all-gather (reduce-scatter backward) and each g a
reduce-scatter (all-gather backward): the same bytes, and activations 1/t the size.
Parameters applied to sequence shards (LayerNorms, position embedding,
row-parallel biases) then see only part of the batch on each rank, so their
gradients must be summed over the tensor-parallel group — forgetting it is the
bug behind Megatron-LM issue #1446. `train_step` does that sum.
"""

from __future__ import annotations

import copy
import re

import torch
import torch.nn as nn

from . import comm, mappings, trace
from .dropout import ShardedDropout
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .loss import vocab_parallel_cross_entropy
from .mesh import Mesh
from .model import GPT, GPTConfig
from .recompute import Recomputed, check_mode


def _column(module, axis, sp):
    return ColumnParallelLinear.from_dense(module, axis, sequence_parallel=sp)


def _row(module, axis, sp):
    return RowParallelLinear.from_dense(module, axis, sequence_parallel=sp)


def _vocab(module, axis, sp):
    return VocabParallelEmbedding.from_dense(module, axis, sequence_parallel=sp)


def _sharded_dropout(module, axis, sp):
    return ShardedDropout.from_dense(module, axis)


# What each module of the plain GPT becomes on a tensor-parallel rank.
TENSOR_PARALLEL_PLAN = [
    ("wte", _vocab),  # rows split by vocabulary; also the tied output projection
    ("blocks.*.attn.qkv", _column),  # columns = whole heads with their q, k, v
    ("blocks.*.attn.core.dropout", _sharded_dropout),  # each rank's heads: own masks
    ("blocks.*.attn.proj", _row),
    ("blocks.*.mlp.fc", _column),
    ("blocks.*.mlp.proj", _row),
]

# With sequence parallelism the residual stream is split too: its dropouts draw
# independent masks, and these parameters' gradients are partial on each rank.
SEQUENCE_PARALLEL_PLAN = [
    ("dropout", _sharded_dropout),
    ("blocks.*.attn.dropout", _sharded_dropout),
    ("blocks.*.mlp.dropout", _sharded_dropout),
]
SEQUENCE_PARALLEL_PARTIAL_GRADS = [
    "wpe.*", "ln_f.*", "blocks.*.ln1.*", "blocks.*.ln2.*",
    "blocks.*.attn.proj.bias", "blocks.*.mlp.proj.bias",
]

RECOMPUTE_PLAN = {"full": "blocks.*", "selective": "blocks.*.attn.core"}


def check_parallel_config(cfg: GPTConfig, tp: int = 1, pp: int = 1, dp: int = 1,
                          sequence_parallel: bool = False, recompute=None,
                          virtual_stages: int = 1, world_size: int | None = None) -> None:
    """Raise a clear ValueError if `cfg` cannot be split this way. Call it in the
    parent, before any process starts; `parallelize` calls it again on every rank."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("virtual_stages", virtual_stages)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if cfg.n_head % tp:
        raise ValueError(
            f"n_head={cfg.n_head} is not divisible by tp={tp}: tensor parallelism gives "
            "every rank the same number of whole attention heads"
        )
    if cfg.d_model % tp:
        raise ValueError(f"d_model={cfg.d_model} (the hidden size) is not divisible by tp={tp}")
    if sequence_parallel and cfg.seq_len % tp:
        raise ValueError(
            f"seq_len={cfg.seq_len} is not divisible by tp={tp}: sequence parallelism gives "
            "every rank an equal slice of the sequence"
        )
    if cfg.n_layer % (pp * virtual_stages):
        raise ValueError(
            f"n_layer={cfg.n_layer} is not divisible by pp*virtual_stages={pp * virtual_stages}"
        )
    check_mode(recompute)
    if world_size is not None and dp * pp * tp != world_size:
        raise ValueError(f"dp*pp*tp = {dp}*{pp}*{tp} = {dp * pp * tp}, but world size is "
                         f"{world_size}")


class ParallelGPT(nn.Module):
    """This rank's shard of a GPT. ``forward(idx, targets)`` takes the full (B, T)
    batch on every tensor-parallel rank and returns (local_logits, loss):
    local_logits (B, T, V'/t) are this rank's vocabulary columns; the loss is
    the full model's, the same on every rank."""

    def __init__(self, shard: GPT, mesh: Mesh, sequence_parallel: bool):
        super().__init__()
        self.cfg, self.mesh, self.sequence_parallel = shard.cfg, mesh, sequence_parallel
        self.wte, self.wpe, self.dropout = shard.wte, shard.wpe, shard.dropout
        self.blocks, self.ln_f = shard.blocks, shard.ln_f

    def forward(self, idx, targets=None):
        with trace.forward_phase():
            return self._forward(idx, targets)

    def _forward(self, idx, targets):
        B, T = idx.shape
        tp = self.mesh.tp
        if T != self.cfg.seq_len and self.sequence_parallel and T % tp.size:
            raise ValueError(f"sequence of {T} tokens cannot be split across tp={tp.size}")
        positions = torch.arange(T, device=idx.device)
        if self.sequence_parallel:
            positions = positions.chunk(tp.size)[tp.rank]  # this rank's slice of the sequence
        with trace.label("embedding"):
            x = self.dropout(self.wte(idx) + self.wpe(positions))  # (B, T or T/t, C)
        for index, block in enumerate(self.blocks):
            with trace.label(f"layer{index}"):
                x = block(x)
        x = self.ln_f(x)
        with trace.label("head"):
            if self.sequence_parallel:
                x = mappings.all_gather_from_sequence(x, tp)  # (B, T, C)
            else:
                x = mappings.copy_to_parallel(x, tp)
            logits = x @ self.wte.weight.T  # (B, T, V'/t): the tied output projection
        loss = None
        if targets is not None:
            with trace.label("loss"):
                loss = vocab_parallel_cross_entropy(logits, targets, tp,
                                                    vocab_size=self.cfg.vocab_size)
        return logits, loss

    def partial_grad_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradients each rank holds only in part (sequence parallelism)."""
        return [p for p in self.parameters() if getattr(p, "sequence_parallel", False)]

    def sync_partial_grads(self) -> None:
        """Sum the partial gradients over the tensor-parallel group: one all-reduce
        of all of them flattened together, rather than one per parameter."""
        params = [p for p in self.partial_grad_parameters() if p.grad is not None]
        if not params or self.mesh.tp.size == 1:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        with trace.label("sequence-parallel grads"), trace.phase("bwd"):
            flat = comm.all_reduce(flat, self.mesh.tp)
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p.grad))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The dense model's parameters, gathered from every rank's shard (on every
        rank), under the plain GPT's names."""
        return self._gather_dense(lambda p: p.detach())

    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        """The dense model's gradients, gathered likewise (call after backward and,
        with sequence parallelism, after `sync_partial_grads`)."""
        return self._gather_dense(lambda p: p.grad)

    def _gather_dense(self, tensor_of) -> dict[str, torch.Tensor]:
        tp = self.mesh.tp
        dense = {}
        with trace.paused():
            for name, p in self.named_parameters():
                value = tensor_of(p)
                dim = getattr(p, "tp_split_dim", None)
                if value is not None and dim is not None:
                    value = comm.all_gather(value, tp, dim=dim)
                    true_size = getattr(p, "tp_true_size", None)
                    if true_size is not None:
                        value = value.narrow(dim, 0, true_size)  # drop vocabulary padding
                dense[_dense_name(name)] = value
        return dense


def _dense_name(name: str) -> str:
    return re.sub(r"(^|\.)module(?=\.)", "", name).lstrip(".")


def _matches(name: str, pattern: str) -> bool:
    """Dotted-name match where * stands for exactly one component ("blocks.*" is a block)."""
    regex = r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in pattern.split("."))
    return re.fullmatch(regex, name) is not None


def _replace(model: nn.Module, pattern: str, make) -> int:
    count = 0
    for name, module in list(model.named_modules()):
        if name and _matches(name, pattern):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, make(module))
            count += 1
    return count


def parallelize(ref: GPT, mesh: Mesh, sequence_parallel: bool = False, recompute=None,
                virtual_stages: int = 1) -> ParallelGPT:
    """This rank's shard of `ref` (weights copied from it), for the mesh's tp axis."""
    if not isinstance(ref, GPT):
        raise TypeError(f"parallelize expects a minitp GPT, got {type(ref).__name__}")
    check_parallel_config(ref.cfg, mesh.tp.size, mesh.pp.size, mesh.dp.size, sequence_parallel,
                          recompute, virtual_stages, mesh.world_size)
    if mesh.pp.size > 1 or mesh.dp.size > 1 or virtual_stages > 1:
        raise NotImplementedError(
            "pipeline and data parallelism arrive with lessons 07 and 08; this version "
            "parallelizes over the tp axis (use Mesh(dp=1, pp=1, tp=n))"
        )
    shard = copy.deepcopy(ref)
    tp = mesh.tp
    plan = TENSOR_PARALLEL_PLAN + (SEQUENCE_PARALLEL_PLAN if sequence_parallel else [])
    for pattern, rule in plan:
        if not _replace(shard, pattern, lambda m, rule=rule: rule(m, tp, sequence_parallel)):
            raise RuntimeError(f"plan entry {pattern!r} matched no module of the GPT")
    if sequence_parallel:
        for name, p in shard.named_parameters():
            if any(_matches(name, pat) for pat in SEQUENCE_PARALLEL_PARTIAL_GRADS):
                p.sequence_parallel = True
    if recompute:
        _replace(shard, RECOMPUTE_PLAN[recompute], Recomputed)
    return ParallelGPT(shard, mesh, sequence_parallel)
