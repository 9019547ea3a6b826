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
Megatron's `resharding/planner.py` exchanges shard metadata instead). The plan's index
lists and the report's constants are computed once, in `Refit(...)` (`refit_routes`):
a call gathers each message from the training tensors and writes the served ones from
what it kept and received, through index lists as long as what it holds and serves.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..checkpoint.layout import Space, _id_model, _ids, _model_tensors, local_ids
from ..data_parallel import zero
from ..parallelize import parallelize
from ..rules import model_chunks, model_placement
from ..runtime import _device, comm, trace
from ..runtime.mesh import Mesh, world
from .refit_checks import agree, check_facts, check_refit, refusal
from .refit_routes import RefitReport, Routes, plan_sources, post

__all__ = ["Refit", "RefitReport", "plan_sources", "refit", "source_plan"]

VIA = "refit"  # the axis name the refit's messages carry in the trace


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
        family_of, held, owned_at, owned_size = self._owned(tensors)
        with trace.paused():  # bookkeeping: who holds what, who needs what
            table = comm.all_gather(torch.stack([held, need]).to(_device.device()), world())
        self.source = plan_sources(table[0::2].cpu(), table[1::2].cpu())
        self._constants(family_of, owned_at, owned_size)

    def _owned(self, tensors):
        """Each training tensor's family; the mask of the dense elements this rank holds;
        and, per family, where each element lies in the flat concatenation of its training
        tensors of that family (-1: not held; a later tensor wins, as a write would)."""
        family_of = [_family(ids, self.families) for ids in self.source_ids]
        held = torch.zeros(self.space.n_model, dtype=torch.uint8)
        owned_at = [torch.full((hi - lo,), -1, dtype=torch.int64) for lo, hi, _ in self.families]
        offsets = [0] * len(self.families)
        for ids, f in zip(self.source_ids, family_of, strict=True):
            keep = ids >= 0
            at = offsets[f] + torch.nonzero(keep).flatten()
            owned_at[f][ids[keep] - self.families[f][0]] = at
            held[ids[keep]] = 1
            offsets[f] += ids.numel()
        return family_of, held, owned_at, offsets

    def _constants(self, family_of, owned_at, owned_size) -> None:
        """What depends on the plan alone, computed once: the routes and the report's
        constants; each send's positions in the training tensors' concatenation; each
        served tensor's positions in its family's pool (the concatenation, then the
        received buffers in order, then one zero for the padding)."""
        device = _device.device()
        self.routes = Routes.of(self.source, self.me, self.families)
        self._family_of = family_of
        self._send_at = [owned_at[f][ids].to(device) for f, _, ids in self.routes.outgoing]
        pool_at = [torch.where(self.source[self.me, lo:hi] == self.me, owned_at[f], -1)
                   for f, (lo, hi, _) in enumerate(self.families)]
        size = list(owned_size)  # each family's pool: its training tensors first
        for f, _, ids in self.routes.incoming:
            pool_at[f][ids] = size[f] + torch.arange(ids.numel())
            size[f] += ids.numel()
        self._served_at, self._served_family = [], []
        for ids in self.target_ids:
            keep, f = ids >= 0, _family(ids, self.families)
            at = torch.full((ids.numel(),), size[f], dtype=torch.int64)  # the zero
            at[keep] = pool_at[f][ids[keep] - self.families[f][0]]
            if bool((at < 0).any()):
                raise RuntimeError(f"refit plan: rank {self.me} serves elements it gets "
                                   "from no rank")
            self._served_at.append(at.to(device))
            self._served_family.append(f)

    @classmethod
    def for_generator(cls, cfg, target_mesh: Mesh | None) -> Refit:
        """The refit as a rank that serves and does not train sees it: the model's config
        (the plan's masks come from the trainers' ranks)."""
        return cls(None, target_mesh, cfg=cfg)

    def refit_once(self) -> RefitReport:
        """The model's weights now, into `served` (collective: every rank calls it). Only
        copies and messages: the indices were computed once (`Refit._constants`)."""
        tensors = [] if self.model is None else _model_tensors(self.model)[0]
        device = _device.device()
        with torch.no_grad():
            owned = [torch.cat([t.detach().reshape(-1).to(device, dtype) for t, g in
                                zip(tensors, self._family_of, strict=True) if g == f]
                               or [torch.empty(0, dtype=dtype, device=device)])
                     for f, (_, _, dtype) in enumerate(self.families)]
            sends = [owned[f][at] for (f, _, _), at in zip(self.routes.outgoing, self._send_at,
                                                           strict=True)]
            got, report = post(self.routes, sends, self.families, VIA)
            if self.served is None:
                return report
            pools = [torch.cat([owned[f], *(b for (g, _, _), b in zip(
                self.routes.incoming, got, strict=True) if g == f),
                torch.zeros(1, dtype=dtype, device=device)])  # padding 0, as parallelize's
                for f, (_, _, dtype) in enumerate(self.families)]
            # (the served tensors read now: a cast may have replaced them)
            for t, at, f in zip(_model_tensors(self.served)[0], self._served_at,
                                self._served_family, strict=True):
                t.copy_(pools[f][at].view(t.shape))
        return report


def refit(model, target_mesh: Mesh | None, plan: dict | None = None, *, cfg=None):
    """This rank's serving shard (`tp_model`'s layout on `target_mesh`, or pp_generate's
    with pp > 1; None where `target_mesh` is None) of the trained parallel `model` (None on
    a rank that only serves: pass `cfg`), and its `RefitReport`: `Refit` planned and run
    once. Collective: every rank of the launch calls it."""
    planned = Refit(model, target_mesh, plan, cfg=cfg)
    return planned.served, planned.refit_once()
