"""Pipeline parallelism: the layers cut into stages, microbatches flowing through.

`split_into_stages` cuts a (tensor-parallel) GPT into this rank's stages: with
pp ranks and v virtual stages per rank, pp·v runs of layers (equal, or as a pipeline
layout says: `minitp.rules.layouts`), rank r
holding runs r, r+pp, r+2pp, … (Megatron-LM's round-robin, placement "loop"), or, with
two chunks in a V (placement "v"), runs r and 2pp−1−r (`minitp.rules.schedules`). Every stage is a
`ParallelGPT` with the model's one forward; where a stage lacks the embedding
or the head, a `Skipped` pass-through stands in (picotron's `nn.Identity`).

The order of forwards and backwards is a schedule (`minitp.pipeline.schedules`), and
`minitp.pipeline.executor` runs one over these stages.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ..mixed_precision import grad_of, set_grad
from ..parallel_gpt import ParallelGPT
from ..rules import rank_and_chunk, stage_of
from ..rules.layouts import layout_stages
from ..runtime import comm, trace
from ..runtime.mesh import Axis, Mesh, layout
from ..tensor_parallel.partial_grads import sum_partial_grads
from .schedules import SCHEDULES, gpipe, interleaved, one_f_one_b, zb_h1, zb_h2  # noqa: F401


class Skipped(nn.Module):
    """A piece of the model that runs on another pipeline stage: passes its input
    through. It keeps `module` where this stage still needs its weights — the
    last stage's copy of the tied embedding, which its output head uses."""

    def __init__(self, module: nn.Module | None = None):
        super().__init__()
        self.module = module

    def forward(self, x, *_, **__):  # (a packed batch's positions too)
        return x


def split_into_stages(model: nn.Module, mesh: Mesh, virtual_stages: int = 1,
                      sequence_parallel: bool = False,
                      placement: str = "loop", pipeline_layout=None) -> list[ParallelGPT]:
    """This rank's stages of `model` (a GPT after tensor parallelism): one per
    virtual stage, in chunk order. Without a pipeline: one stage, the whole model.
    pipeline_layout: each stage's layers (`minitp.rules.layouts`; None: equal runs)."""
    pp, n_stages = mesh.pp.size, mesh.pp.size * virtual_stages
    layers_of = layout_stages(pipeline_layout, model.cfg.n_layer, pp, virtual_stages)
    stages = []
    for k in range(virtual_stages):
        g = stage_of(pp, mesh.pp.rank, k, placement)  # this stage's place in the whole model
        first, last = g == 0, g == n_stages - 1
        layers = layers_of[g]
        pieces = {"blocks": nn.ModuleList(model.blocks[layers.start:layers.stop])}
        for name in ("wte", "vision", "wpe", "dropout"):
            pieces[name] = getattr(model, name) if first else Skipped()
        for name in ("ln_f", "head", "loss"):
            pieces[name] = getattr(model, name) if last else Skipped()
        if last and not first:
            # The tied embedding is also the output projection: the last stage keeps
            # its own copy (whose gradient `PipelineGPT.sync_embedding_grads` adds to
            # the first stage's — on the same rank in a V). Copy it with the head that
            # points at it; the axis (a process group) is shared, not copied.
            memo = {id(mesh.tp): mesh.tp}
            wte, pieces["head"] = copy.deepcopy((model.wte, model.head), memo)
            pieces["wte"] = Skipped(wte)
        stages.append(ParallelGPT(model.cfg, mesh, sequence_parallel, pieces, layers, first,
                                  last))
    return stages


def embedding_axis(mesh: Mesh, placement: str = "loop") -> Axis | None:
    """The group of the first and last pipeline stage of this rank's pipeline,
    which both hold the tied embedding (Megatron's embedding group). Every rank
    creates every such group, in the same order, as process groups require;
    None on ranks in neither stage, without a pipeline, or in a V (both stages on
    rank 0: `PipelineGPT.sync_embedding_grads` adds the two copies there)."""
    if mesh.pp.size == 1 or placement == "v":
        return None
    mine = None
    for ranks in layout(mesh.dp_size, mesh.pp_size, mesh.tp_size, cp=mesh.cp_size)["pp"]:
        pair = [mesh.ranks[ranks[0]], mesh.ranks[ranks[-1]]]  # (a grid on part of the world)
        group = mesh.new_group(pair)
        if mesh.rank in pair:
            mine = Axis("embedding", tuple(pair), pair.index(mesh.rank), group)
    return mine


class PipelineGPT(nn.Module):
    """This rank's stages of a pipelined GPT (one per virtual stage, called its
    chunks, as in Megatron-LM), each a `ParallelGPT` over the tensor-parallel axis."""

    def __init__(self, chunks, mesh: Mesh, embedding: Axis | None, dense: dict,
                 placement: str = "loop", pipeline_layout=None):
        super().__init__()
        self.chunks, self.mesh, self.embedding = nn.ModuleList(chunks), mesh, embedding
        self.placement = placement
        # every stage's layers, in model order (`minitp.rules.layouts`), this rank's and not
        self.stage_layers = layout_stages(pipeline_layout, chunks[0].cfg.n_layer, mesh.pp.size,
                                          len(chunks))
        self._dense = dense  # plain name -> (shape, dtype) of the dense model's parameters
        self.cfg, self.sequence_parallel = chunks[0].cfg, chunks[0].sequence_parallel

    def forward(self, *args, **kwargs):
        raise TypeError("a pipelined model runs through mt.train_step (its stages live on "
                        "several ranks); call a chunk, model.chunks[k], to run one stage")

    def partial_grad_parameters(self) -> list[nn.Parameter]:
        return [p for c in self.chunks for p in c.partial_grad_parameters()]

    def sync_partial_grads(self) -> None:
        """Sum the sequence-parallel partial gradients over tp, all chunks at once."""
        sum_partial_grads(self.partial_grad_parameters(), self.mesh.tp)

    def sync_embedding_grads(self) -> None:
        """The tied embedding has a copy on the first and the last stage; each got
        the gradient of its use (lookup, output projection). The true gradient is
        their sum, so both copies take the same step and stay equal."""
        if self.placement == "v" and self.chunks[0].first:  # both copies here: add them
            lookup, head = self.chunks[0].wte.weight, self.chunks[1].head.weight
            grads = [grad_of(w) for w in (lookup, head)]
            total = sum(g if g is not None else torch.zeros_like(lookup) for g in grads)
            set_grad(lookup, total)
            set_grad(head, total.clone())
            return
        if self.embedding is None:
            return
        weight = self.chunks[0].wte.weight if self.chunks[0].first else self.chunks[-1].head.weight
        grad = grad_of(weight)
        grad = grad if grad is not None else torch.zeros_like(weight)
        with trace.label("embedding grads"), trace.phase("bwd"):
            set_grad(weight, comm.all_reduce(grad, self.embedding))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The dense model's parameters under the plain names, on every rank:
        gathered over tp by each chunk, then broadcast over pp from the stage that
        holds each one."""
        return self._gather(lambda c: c.full_state_dict())

    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        return self._gather(lambda c: c.full_grad_dict())

    def _gather(self, dense_of) -> dict[str, torch.Tensor]:
        pp, last_stage = self.mesh.pp, len(self.stage_layers) - 1
        stage_of_layer = {i: g for g, layers in enumerate(self.stage_layers) for i in layers}
        mine = {}
        for c in self.chunks:  # the first chunk first: in a V, rank 0's lookup copy of the
            for name, value in dense_of(c).items():  # tied embedding, not the head's copy
                mine.setdefault(name, value)
        out, device = {}, next(self.parameters()).device
        with trace.paused():
            for name, (shape, dtype) in self._dense.items():
                if name.startswith("blocks."):
                    stage = stage_of_layer[int(name.split(".")[1])]
                    owner = rank_and_chunk(pp.size, stage, self.placement)[0]
                elif name.startswith(("ln_f.",)):
                    owner = rank_and_chunk(pp.size, last_stage, self.placement)[0]
                else:  # wte, wpe: the first stage
                    owner = 0
                value = mine.get(name) if pp.rank == owner else None
                if value is None:
                    value = torch.zeros(shape, dtype=dtype, device=device)
                out[name] = comm.broadcast(value, pp, src=owner)
        return out
