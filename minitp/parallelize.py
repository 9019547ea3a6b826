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

Across the other two axes (`parallelize` builds these too): with pp > 1 the
layers are cut into chunks (`minitp.pipeline`), each a `ParallelGPT` holding only
its layers — the embedding on the first, final LayerNorm, tied head and loss on
the last; with dp > 1 each chunk gets a bucketed, overlapped gradient all-reduce
(`minitp.data_parallel`).
"""

from __future__ import annotations

import copy
import re

import torch
import torch.nn as nn

from . import comm, mappings, trace
from .data_parallel import GradSync
from .dropout import ShardedDropout
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .loss import vocab_parallel_cross_entropy
from .mesh import Mesh
from .model import GPT, GPTConfig
from .partial_grads import sum_partial_grads
from .pipeline import PipelineGPT, embedding_axis
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


SCHEDULES = (None, "gpipe", "1f1b", "interleaved")


def check_parallel_config(cfg: GPTConfig, tp: int = 1, pp: int = 1, dp: int = 1,
                          sequence_parallel: bool = False, recompute=None,
                          virtual_stages: int = 1, world_size: int | None = None, *,
                          schedule=None, microbatches: int | None = None,
                          batch_size: int | None = None) -> None:
    """Raise a clear ValueError if `cfg` cannot be split this way. Call it in the
    parent, before any process starts; `parallelize` calls it again on every rank,
    and `train_step` with the schedule, microbatches and batch size it was given."""
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
    if virtual_stages > 1 and pp == 1:
        raise ValueError(f"virtual_stages={virtual_stages} needs a pipeline (pp > 1): interleaving "
                         "splits each pipeline rank's layers into several chunks")
    check_mode(recompute)
    if world_size is not None and dp * pp * tp != world_size:
        raise ValueError(f"dp*pp*tp = {dp}*{pp}*{tp} = {dp * pp * tp}, but world size is "
                         f"{world_size}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if schedule is not None and (schedule == "interleaved") != (virtual_stages > 1):
        raise ValueError(f"schedule {schedule!r} does not fit virtual_stages={virtual_stages}: "
                         "'interleaved' needs virtual_stages > 1, the other schedules 1")
    if microbatches is not None:
        if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
            raise ValueError(f"microbatches must be a positive integer, got {microbatches!r}")
        if virtual_stages > 1 and microbatches % pp:
            raise ValueError(f"the interleaved schedule needs microbatches ({microbatches}) "
                             f"divisible by pp ({pp}): they go through each chunk in groups of pp")
        if batch_size is not None and batch_size % (dp * microbatches):
            raise ValueError(f"the batch of {batch_size} rows cannot be cut into dp={dp} slices "
                             f"of microbatches={microbatches} equal microbatches")


class ParallelGPT(nn.Module):
    """This rank's shard of a GPT — or, in a pipeline, of one chunk of its layers.

    ``forward(inputs, targets)``: the first chunk takes the token ids (B, T), a
    later chunk the previous chunk's activations (B, T or T/t, C). A chunk that
    is not the last returns (activations, None); the last returns
    (local_logits, loss): local_logits (B, T, V'/t) are this rank's vocabulary
    columns; the loss is the full model's, the same on every tensor-parallel rank.
    Without a pipeline there is one chunk, first and last: the whole model.
    """

    def __init__(self, shard: GPT, mesh: Mesh, sequence_parallel: bool, layers=None,
                 first: bool = True, last: bool = True, wte: nn.Module | None = None):
        super().__init__()
        self.cfg, self.mesh, self.sequence_parallel = shard.cfg, mesh, sequence_parallel
        layers = range(shard.cfg.n_layer) if layers is None else layers
        self.first, self.last, self.layer_offset = first, last, layers.start
        # The tied embedding lives on the first chunk (lookup) and the last (output
        # projection); in a pipeline those are two copies whose gradients are summed.
        self.wte = (wte if wte is not None else shard.wte) if first or last else None
        self.wpe, self.dropout = (shard.wpe, shard.dropout) if first else (None, None)
        self.blocks = nn.ModuleList(shard.blocks[i] for i in layers)
        self.ln_f = shard.ln_f if last else None

    def forward(self, inputs, targets=None):
        with trace.forward_phase():
            return self._forward(inputs, targets)

    def _forward(self, inputs, targets):
        tp = self.mesh.tp
        if self.first:
            idx = inputs
            T = idx.shape[1]
            if T != self.cfg.seq_len and self.sequence_parallel and T % tp.size:
                raise ValueError(f"sequence of {T} tokens cannot be split across tp={tp.size}")
            positions = torch.arange(T, device=idx.device)
            if self.sequence_parallel:
                positions = positions.chunk(tp.size)[tp.rank]  # this rank's slice of the sequence
            with trace.label("embedding"):
                x = self.dropout(self.wte(idx) + self.wpe(positions))  # (B, T or T/t, C)
        else:
            x = inputs  # (B, T or T/t, C): the previous stage's output
        for index, block in enumerate(self.blocks):
            with trace.label(f"layer{self.layer_offset + index}"):
                x = block(x)
        if not self.last:
            return x, None
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
        """Sum the partial gradients over the tensor-parallel group."""
        sum_partial_grads(self.partial_grad_parameters(), self.mesh.tp)

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
                dense[_dense_name(name, self.layer_offset)] = value
        return dense


def _dense_name(name: str, layer_offset: int = 0) -> str:
    name = re.sub(r"(^|\.)module(?=\.)", "", name).lstrip(".")
    # a pipeline chunk numbers its blocks from 0; the plain GPT from the chunk's first layer
    return re.sub(r"^blocks\.(\d+)", lambda m: f"blocks.{int(m[1]) + layer_offset}", name)


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
                virtual_stages: int = 1, bucket_bytes: int = 1 << 20):
    """This rank's part of `ref` (weights copied from it) for the whole mesh.

    tp: every layer is sharded by the plan table. pp: the layers are cut into
    pp·virtual_stages equal chunks; this rank holds chunks r, r+pp, r+2pp, …
    (Megatron's round-robin) — a `PipelineGPT`; without a pipeline, the single
    chunk is a `ParallelGPT`. dp: every chunk gets a bucketed gradient all-reduce
    (`minitp.data_parallel.GradSync`, buckets of `bucket_bytes`) that
    `train_step` arms for the last microbatch; `zero1_optimizer` replaces it
    with a reduce-scatter.
    """
    if not isinstance(ref, GPT):
        raise TypeError(f"parallelize expects a minitp GPT, got {type(ref).__name__}")
    check_parallel_config(ref.cfg, mesh.tp.size, mesh.pp.size, mesh.dp.size, sequence_parallel,
                          recompute, virtual_stages, mesh.world_size)
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
    pp, n_chunks = mesh.pp.size, mesh.pp.size * virtual_stages
    per_chunk = ref.cfg.n_layer // n_chunks
    chunks = []
    for k in range(virtual_stages):
        g = k * pp + mesh.pp.rank  # this chunk's place in the whole model
        layers = range(g * per_chunk, (g + 1) * per_chunk)
        last = g == n_chunks - 1
        # In a pipeline the last stage needs its own copy of the tied embedding.
        wte = (copy.deepcopy(shard.wte, {id(tp): tp})  # the axis (a process group) is shared
               if last and n_chunks > 1 else None)
        chunks.append(ParallelGPT(shard, mesh, sequence_parallel, layers, first=g == 0,
                                  last=last, wte=wte))
    for chunk in chunks:
        chunk.grad_sync = (GradSync(list(chunk.parameters()), mesh.dp, bucket_bytes)
                           if mesh.dp.size > 1 else None)
    if n_chunks == 1:
        return chunks[0]
    dense = {name: (tuple(p.shape), p.dtype) for name, p in ref.named_parameters()}
    return PipelineGPT(chunks, mesh, embedding_axis(mesh), dense)
