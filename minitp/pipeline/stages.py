"""Pipeline parallelism: the layers cut into stages, microbatches flowing through.

`split_into_stages` cuts a (tensor-parallel) GPT into this rank's stages: with
pp ranks and v virtual stages per rank, pp·v equal runs of layers, rank r
holding runs r, r+pp, r+2pp, … (Megatron-LM's round-robin, placement "loop"), or, with
two chunks in a V (placement "v"), runs r and 2pp−1−r (`minitp.rules.schedules`). Every stage is a
`ParallelGPT` with the model's one forward; where a stage lacks the embedding
or the head, a `Skipped` pass-through stands in (picotron's `nn.Identity`).

The order of forwards and backwards is a schedule (`minitp.pipeline.schedules`);
`run_schedule` executes one: activations go forward and gradients backward
through `minitp.runtime.comm` p2p, each message tagged by what it carries, sends posted
without waiting (so a rank blocks only on a receive it needs, and a valid
order cannot deadlock), compute recorded as trace regions "F3" / "B3" (with
":k" for chunk k when v > 1; `minitp.rules.unit_label`).
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from ..mixed_precision import grad_of, set_grad
from ..parallel_gpt import ParallelGPT
from ..rules import rank_and_chunk, stage_of, unit_label
from ..runtime import comm, trace
from ..runtime.mesh import Axis, Mesh, layout
from ..tensor_parallel.partial_grads import sum_partial_grads
from ..tensor_parallel.weight_grad import DeferredWeightGrads
from .schedules import SCHEDULES, gpipe, interleaved, one_f_one_b, zb_h1, zb_h2  # noqa: F401


class Skipped(nn.Module):
    """A piece of the model that runs on another pipeline stage: passes its input
    through. It keeps `module` where this stage still needs its weights — the
    last stage's copy of the tied embedding, which its output head uses."""

    def __init__(self, module: nn.Module | None = None):
        super().__init__()
        self.module = module

    def forward(self, x, *_):
        return x


def split_into_stages(model: nn.Module, mesh: Mesh, virtual_stages: int = 1,
                      sequence_parallel: bool = False,
                      placement: str = "loop") -> list[ParallelGPT]:
    """This rank's stages of `model` (a GPT after tensor parallelism): one per
    virtual stage, in chunk order. Without a pipeline: one stage, the whole model."""
    pp, n_stages = mesh.pp.size, mesh.pp.size * virtual_stages
    per_stage = model.cfg.n_layer // n_stages
    stages = []
    for k in range(virtual_stages):
        g = stage_of(pp, mesh.pp.rank, k, placement)  # this stage's place in the whole model
        first, last = g == 0, g == n_stages - 1
        pieces = {"blocks": nn.ModuleList(model.blocks[g * per_stage:(g + 1) * per_stage])}
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
        stages.append(ParallelGPT(model.cfg, mesh, sequence_parallel, pieces,
                                  range(g * per_stage, (g + 1) * per_stage), first, last))
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
        pair = [ranks[0], ranks[-1]]
        group = dist.new_group(pair)
        if mesh.rank in pair:
            mine = Axis("embedding", tuple(pair), pair.index(mesh.rank), group)
    return mine


class PipelineGPT(nn.Module):
    """This rank's stages of a pipelined GPT (one per virtual stage, called its
    chunks, as in Megatron-LM), each a `ParallelGPT` over the tensor-parallel axis."""

    def __init__(self, chunks, mesh: Mesh, embedding: Axis | None, dense: dict,
                 placement: str = "loop"):
        super().__init__()
        self.chunks, self.mesh, self.embedding = nn.ModuleList(chunks), mesh, embedding
        self.placement = placement
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
        pp, per_chunk = self.mesh.pp, len(self.chunks[0].blocks)
        last_stage = pp.size * len(self.chunks) - 1
        mine = {}
        for c in self.chunks:  # the first chunk first: in a V, rank 0's lookup copy of the
            for name, value in dense_of(c).items():  # tied embedding, not the head's copy
                mine.setdefault(name, value)
        out, device = {}, next(self.parameters()).device
        with trace.paused():
            for name, (shape, dtype) in self._dense.items():
                if name.startswith("blocks."):
                    stage = int(name.split(".")[1]) // per_chunk
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


def run_schedule(order, chunks, mesh: Mesh, microbatches, weights, before_backward=None,
                 placement: str = "loop"):
    """Run one rank's `order` of ("F"/"B"/"W", chunk, microbatch).

    microbatches: list of (x, y); weights: each microbatch's share of the loss.
    `before_backward(chunk_index, microbatch)` is called before each backward and each
    weight pass (data parallelism arms its gradient sync there). A "B" whose (chunk,
    microbatch) also has a "W" in the order computes the input gradient and leaves the
    linear layers' weight gradients to that "W" (`minitp.tensor_parallel.weight_grad`: the
    microbatch's forward already keeps those weights out of the graph). placement: where the chunks
    sit ("v": a stage whose neighbour is on this rank hands it the tensor directly).
    Returns the sum of the weighted losses this rank computed (0 off the last stage),
    float64.
    """
    pp, v = mesh.pp, len(chunks)
    p, r, m = pp.size, pp.rank, len(microbatches)
    n = p * v
    sp, tp = chunks[0].sequence_parallel, mesh.tp
    cfg = chunks[0].cfg
    dtype, device = chunks[0].activation_dtype, next(chunks[0].parameters()).device
    split = check_split_order(order, v, m)
    deferred: dict[tuple[int, int], DeferredWeightGrads] = {}
    inputs, outputs, sends = {}, {}, []
    here = {}  # tag -> tensor a stage handed to a neighbouring stage on this same rank
    loss_sum = torch.zeros((), dtype=torch.float64)

    def local(g):
        return rank_and_chunk(p, g, placement)[0] == r

    def send(tensor, g, tag_):
        if local(g):
            here[tag_] = tensor.detach().clone()  # as a message would: a copy, no graph
        else:
            sends.append(comm.isend(tensor, pp.ranks[rank_and_chunk(p, g, placement)[0]], tag_))

    def receive(buf, g, tag_):
        if local(g):
            return here.pop(tag_)
        return comm.irecv(buf, pp.ranks[rank_and_chunk(p, g, placement)[0]], tag_).wait()

    def tag(kind, g, i):  # unique per message: activation into / gradient out of chunk g
        return 2 * (g * m + i) + (kind == "B")

    for kind, k, i in order:
        g = stage_of(p, r, k, placement)
        chunk = chunks[k]
        x, y = microbatches[i]
        if kind == "F":
            if g == 0:
                inp = x
            else:
                T = x.shape[1] // tp.size if sp else x.shape[1]
                buf = torch.empty((x.shape[0], T, cfg.d_model), dtype=dtype,
                                  device=device)  # (B, T or T/t, C)
                with trace.label("pipeline"), trace.phase("fwd"):
                    inp = receive(buf, g - 1, tag("F", g, i))
                inp.requires_grad_()
            store = deferred.setdefault((k, i), DeferredWeightGrads()) if (k, i) in split else None
            with trace.region(unit_label("F", i, k, v), "fwd"), weight_grads_to(chunk, store):
                out, loss = chunk(inp, y if g == n - 1 else None)
                if g == n - 1 and weights[i] == 0:  # no targets: its mean is 0/0; learn nothing
                    out = out.sum() * 0.0
                elif g == n - 1:
                    out = loss * weights[i]  # what backward starts from
                    loss_sum += out.detach().double().cpu()
            inputs[(k, i)], outputs[(k, i)] = inp, out
            if g < n - 1:
                with trace.label("pipeline"), trace.phase("fwd"):
                    send(out, g + 1, tag("F", g + 1, i))
        elif kind == "B":
            out, inp = outputs.pop((k, i)), inputs.pop((k, i))
            grad = None
            if g < n - 1:
                with trace.label("pipeline"), trace.phase("bwd"):
                    grad = receive(torch.empty_like(out), g + 1, tag("B", g, i))
            if before_backward is not None:
                before_backward(k, i)
            store = deferred.get((k, i))  # (a recomputed forward runs inside B: set it again)
            with trace.region(unit_label("B", i, k, v), "bwd"), weight_grads_to(chunk, store):
                torch.autograd.backward(out, grad)
            if g > 0:
                with trace.label("pipeline"), trace.phase("bwd"):
                    send(inp.grad, g - 1, tag("B", g - 1, i))
        else:  # "W": the weight gradients its B left
            if before_backward is not None:
                before_backward(k, i)
            with trace.region(unit_label("W", i, k, v), "bwd"):
                deferred.pop((k, i)).run()
    for pending in sends:
        pending.wait()
    return loss_sum


def check_split_order(order, chunks: int, microbatches: int) -> set[tuple[int, int]]:
    """The (chunk, microbatch) pairs whose backward `order` splits into B and W, after
    checking what the executor relies on: each W after its B, at most one of each, and
    each chunk's last B or W the last microbatch's (so a gradient sync armed for it
    sees every gradient final)."""
    seen_b, split, last = set(), set(), {}
    for kind, k, i in order:
        if not (0 <= k < chunks and 0 <= i < microbatches):
            raise ValueError(f"schedule unit {(kind, k, i)} names a chunk or microbatch that "
                             f"does not exist ({chunks} chunks, {microbatches} microbatches)")
        if kind == "W":
            if (k, i) not in seen_b or (k, i) in split:
                raise ValueError(f"schedule: W of chunk {k}, microbatch {i} comes before its "
                                 "B, or twice: a weight pass needs the B that stored its work")
            split.add((k, i))
        if kind == "B":
            seen_b.add((k, i))
        if kind in ("B", "W"):
            last[k] = i
    if split and any(i != microbatches - 1 for i in last.values()):
        raise ValueError("schedule: a chunk's last B or W must be the last microbatch's (the "
                         "data-parallel gradient sync starts with it)")
    return split


@contextlib.contextmanager
def weight_grads_to(chunk: nn.Module, store: DeferredWeightGrads | None):
    """While inside, the chunk's linear layers leave their weight gradients in `store`
    (None: they compute them at once, a whole backward)."""
    layers = [mod for mod in chunk.modules() if hasattr(mod, "weight_grads")]
    for layer in layers:
        layer.weight_grads = store
    try:
        yield
    finally:
        for layer in layers:
            layer.weight_grads = None
