"""From trainer to generator without a disk: a trained `mt.parallelize` model's weights
moved onto the decoding layout `tp_model` (tp) or `pp_generate` (pp, tp) builds, on the
same ranks (collocated) or on other ranks of the launch (separate: each grid an `mt.Mesh`
over its own ``ranks``; the ranks that only serve pass the config, `Refit.for_generator`).

The plan is the sharded checkpoint's (`minitp.checkpoint.layout`), not a second copy of
the sharding rules: a plain GPT whose every element holds its own id is parallelized at
the training layout (dp, pp, tp, cp, ep, any ZeRO stage) and at the serving one, and the
ids each rank's tensors hold say which dense element each holds. Every rank then knows
what it has and what it must keep; one all-gather of those two masks (bookkeeping, left
out of the trace) gives every rank the same table, from which every rank draws the same
plan: receiver r takes each element it needs from itself if it holds it (collocated: no
message), else from the first holder after it in rank order (so the replicas of dp share
the sending). Each rank then posts one message to each rank it feeds and one receive from
each rank that feeds it, traced as "refit" sends and receives: the bytes a rank received
are read back from the trace (`RefitReport`), beside the plan's count of them, the
minimum (each weight it keeps, once) and a naive refit (the dense model gathered to rank 0
and broadcast whole: every rank receives all of it).

The generator's log-probabilities beside the trainer's: `minitp.serving.parity`.

Every rank of the launch calls it, so that it agrees on the plan: a rank in neither grid
passes None twice. What one rank alone can refuse (a target tp the heads cannot split)
is shared first (`agree`, pickled over the world, bookkeeping): every rank refuses alike.

Where minitp differs from production: the masks are dense (a byte per weight per rank;
Megatron's `resharding/planner.py` exchanges shard metadata instead), and each rank
stages what it holds in one flat buffer of the dense size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..checkpoint.layout import Space, _id_model, _ids, _model_tensors, local_ids
from ..data_parallel import zero
from ..parallelize import parallelize
from ..rules import model_chunks, model_placement
from ..runtime import _device, comm, io_counters, trace
from ..runtime.mesh import Mesh, world
from .refit_checks import agree, check_facts, check_refit, refusal

VIA = "refit"  # the axis name the refit's messages carry in the trace


@dataclass(frozen=True)
class RefitReport:
    """One rank's bytes in a refit: ``received`` (from its trace's refit receives),
    ``planned`` (the plan's count of the same), ``local`` (weights it kept from its own
    training shards, no message), ``minimum`` (each weight it serves, once: planned +
    local), ``broadcast`` (a naive refit: the whole dense model), ``messages`` (the
    receives it posted), ``sent`` (what the plan has it send) and ``sent_measured`` (what
    the kernel counted it writing meanwhile, headers included: `minitp.runtime.io_counters`;
    None where it cannot tell, e.g. NCCL)."""

    rank: int
    received: int
    planned: int
    local: int
    minimum: int
    broadcast: int
    messages: int
    sent: int
    sent_measured: int | None


def source_plan(model) -> dict:
    """The `mt.parallelize` keywords that decide where `model`'s elements lie, read off the
    model: sequence parallelism, the ZeRO stage, and a pipeline's virtual stages, placement
    and stages' layers (dp, cp, tp and ep are its mesh's). A vision model's
    `vision_layout` is not read: pass `plan`."""
    plan = {"sequence_parallel": bool(getattr(model, "sequence_parallel", False)),
            "zero_stage": zero.zero_stage_of(model)}
    if hasattr(model, "stage_layers"):  # a pipeline (`minitp.pipeline.stages.PipelineGPT`)
        plan |= {"virtual_stages": len(model_chunks(model)), "placement": model_placement(model),
                 "pipeline_layout": [len(layers) for layers in model.stage_layers]}
    return plan


def _families(space: Space, dtype) -> list[tuple[int, int, torch.dtype]]:
    """The dense elements by dtype, as (first id, end, dtype): the parameters (the model's
    dtype), then the experts' biases (float32 whatever the model's: `minitp.model.routing`).
    One message per family between two ranks."""
    out = [(0, space.n_params, dtype)]
    if space.n_model > space.n_params:
        out.append((space.n_params, space.n_model, torch.float32))
    return out


def _family(ids: torch.Tensor, families) -> int:
    """Which family a tensor's elements are of (a tensor is all of one)."""
    first = int(ids[ids >= 0][0]) if bool((ids >= 0).any()) else 0
    return next(f for f, (lo, hi, _) in enumerate(families) if lo <= first < hi)


def _placed(space: Space, tensors, ids_list, families):
    """(values, held): one flat buffer a family of the dense elements, with this rank's
    `tensors` written where their `ids_list` say, and a mask of what it holds."""
    values = [torch.zeros(hi - lo, dtype=dtype) for lo, hi, dtype in families]
    held = torch.zeros(space.n_model, dtype=torch.uint8)
    for t, ids in zip(tensors, ids_list, strict=True):
        keep = ids >= 0
        f = _family(ids, families)
        values[f][ids[keep] - families[f][0]] = t.detach().reshape(-1).cpu()[keep]
        held[ids[keep]] = 1
    return values, held


def plan_sources(have: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """(W, n) int64: for receiver r and element i, the rank it takes i from (-1: not
    needed). Itself first where it holds i, then the holders after it in rank order.
    have, need: (W, n) masks. The same on every rank (a function of the masks alone)."""
    world_size, n = have.shape
    source = torch.full((world_size, n), -1, dtype=torch.int64)
    for r in range(world_size):
        for k in range(world_size):
            s = (r + k) % world_size
            take = need[r].bool() & have[s].bool() & (source[r] < 0)
            source[r][take] = s
        if bool((need[r].bool() & (source[r] < 0)).any()):
            raise RuntimeError(f"refit plan: rank {r} needs elements no rank holds")
    return source


class Refit:
    """A refit planned once, run as often as the trainer steps (an RL loop's every N
    steps): ``Refit(model, target_mesh)`` builds the serving shard and the plan; each call
    ``refit_once()`` sends the model's current weights into that same shard (`served`) and
    returns its `RefitReport`. Every rank of the launch calls both. model: this rank's
    trained `mt.parallelize` model, or None where it only serves; target_mesh: this
    rank's serving `mt.Mesh` (tp, or pp and tp: `pp_decode` runs it), or None where it
    only trains (`served` is then None). plan: the `mt.parallelize` keywords `model` was
    built with (default: `source_plan(model)`); cfg: the config, on ranks without a model
    (`Refit.for_generator`)."""

    def __init__(self, model, target_mesh: Mesh | None, plan: dict | None = None, *,
                 cfg=None):
        me = dist.get_rank()
        error = refusal(lambda: check_refit(model, target_mesh, cfg))
        dtype = None if model is None or error else _model_tensors(model)[0][0].dtype
        cfg = getattr(model, "cfg", None) if model is not None else cfg
        facts = agree((error, cfg, dtype))
        check_facts(facts)
        cfg = next(f[1] for f in facts if f[1] is not None)
        space = Space.of(cfg)
        self.model, self.me, self.space = model, me, space
        self.families = _families(space, next(f[2] for f in facts if f[2] is not None))
        tensors, self.source_ids, error = [], [], None
        if model is not None:
            plan = source_plan(model) if plan is None else plan
            with trace.paused():
                self.source_ids = local_ids(cfg, model.mesh, plan, space)[0]
            tensors = _model_tensors(model)[0]
            if [t.numel() for t in tensors] != [i.numel() for i in self.source_ids]:
                error = ("ValueError", "refit: `plan` does not describe this model's layout "
                         "(its tensors differ from the plan's): pass the keywords "
                         "mt.parallelize was given")
        self.served, self.target_ids = None, []
        need = torch.zeros(space.n_model, dtype=torch.uint8)
        if target_mesh is not None:  # (a grid it cannot take, e.g. pp not dividing the
            shell = _id_model(cfg, space).to(_device.device())  # layers: refused below)
            try:
                self.served = parallelize(shell, target_mesh, sequence_parallel=False).eval()
            except (TypeError, ValueError) as exc:
                error = error or (type(exc).__name__, str(exc))
        if self.served is not None:
            self.target_ids = [_ids(t) for t in _model_tensors(self.served)[0]]
            self.served.to(self.families[0][2])  # (the experts' biases stay float32)
            for ids in self.target_ids:
                need[ids[ids >= 0]] = 1
        agree((error,))
        have = _placed(space, tensors, self.source_ids, self.families)[1]
        with trace.paused():  # bookkeeping: who holds what, who needs what
            table = comm.all_gather(torch.stack([have, need]).to(_device.device()), world())
        self.source = plan_sources(table[0::2].cpu(), table[1::2].cpu())

    @classmethod
    def for_generator(cls, cfg, target_mesh: Mesh | None) -> Refit:
        """The refit as a rank that serves and does not train sees it: the model's config
        (the plan's masks come from the trainers' ranks)."""
        return cls(None, target_mesh, cfg=cfg)

    def refit_once(self) -> RefitReport:
        """The model's weights now, into `served` (collective: every rank calls it)."""
        tensors = [] if self.model is None else _model_tensors(self.model)[0]
        values = _placed(self.space, tensors, self.source_ids, self.families)[0]
        got, messages, wrote = _exchange(values, self.source, self.me, self.families)
        if self.served is not None:
            with torch.no_grad():  # (the served tensors read now: a cast may have replaced them)
                for t, ids in zip(_model_tensors(self.served)[0], self.target_ids, strict=True):
                    keep, f = ids >= 0, _family(ids, self.families)
                    flat = torch.zeros(t.numel(), dtype=t.dtype)  # padding 0, as parallelize's
                    flat[keep] = got[f][ids[keep] - self.families[f][0]]
                    t.copy_(flat.view(t.shape).to(t.device))
        return _report(self.me, self.source, messages, self.families, wrote)


def refit(model, target_mesh: Mesh | None, plan: dict | None = None, *, cfg=None):
    """This rank's serving shard (`tp_model`'s layout on `target_mesh`, or pp_generate's
    with pp > 1; None where `target_mesh` is None) of the trained parallel `model` (None on
    a rank that only serves: pass `cfg`), and its `RefitReport`: `Refit` planned and run
    once. Collective: every rank of the launch calls it."""
    planned = Refit(model, target_mesh, plan, cfg=cfg)
    return planned.served, planned.refit_once()


def _exchange(values, source: torch.Tensor, me: int, families, via: str = VIA):
    """Send each rank the elements the plan takes from me, receive mine: all posted at
    once (no rank waits on another's order), one message a family, traced as `via`
    messages. Returns the flat buffers of what I serve, the events of my receives and what
    the kernel counted me writing (None where it cannot tell)."""
    device, world_size = _device.device(), source.shape[0]
    got = [v.clone() for v in values]
    pending, incoming = [], []
    started, written = trace.recorder().now(), io_counters.written()
    for f, (lo, hi, dtype) in enumerate(families):
        for peer in range(world_size):
            if peer == me:
                continue
            out_ids = torch.nonzero(source[peer, lo:hi] == me).flatten()
            if out_ids.numel():
                pending.append(comm.isend(values[f][out_ids].to(device), peer, tag=f, via=via))
            in_ids = torch.nonzero(source[me, lo:hi] == peer).flatten()
            if in_ids.numel():
                buffer = torch.empty(in_ids.numel(), dtype=dtype, device=device)
                incoming.append((f, in_ids, buffer))
                pending.append(comm.irecv(buffer, peer, tag=f, via=via))
    for p in pending:
        p.wait()
    after = io_counters.written()  # the kernel's count: what this rank wrote meanwhile
    wrote = None if written is None or after is None or _device.device().type != "cpu" \
        else after - written
    for f, in_ids, buffer in incoming:
        got[f][in_ids] = buffer.cpu()
    mine = [e for e in trace.events() if e.rank == me and e.op == "recv" and e.axis == via
            and e.start >= started]
    return got, mine, wrote


def _report(me: int, source: torch.Tensor, messages, families, wrote) -> RefitReport:
    remote = local = broadcast = sent = 0
    for lo, hi, dtype in families:
        item, cols = torch.empty(0, dtype=dtype).element_size(), source[:, lo:hi]
        remote += int(((cols[me] >= 0) & (cols[me] != me)).sum()) * item
        local += int((cols[me] == me).sum()) * item
        sent += (int((cols == me).sum()) - int((cols[me] == me).sum())) * item
        broadcast += (hi - lo) * item
    return RefitReport(rank=me, received=sum(e.nbytes for e in messages), planned=remote,
                       local=local, minimum=remote + local, broadcast=broadcast,
                       messages=len(messages), sent=sent, sent_measured=wrote)
