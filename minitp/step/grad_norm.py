"""The global gradient norm over a whole mesh, and clipping by it: `clip_grad_norm`.

One device computes ‖g‖ = sqrt(Σ_p ‖g_p‖²) over its parameters (what
``torch.nn.utils.clip_grad_norm_`` does). A mesh holds the same gradients in pieces and
copies, and each element must be counted exactly once:

* a tensor-parallel shard (tag ``tp_split_dim``) is counted on every tp rank (each holds
  other elements); a parameter replicated over tp (a LayerNorm, a row-parallel bias, the
  router and experts) only on tp rank 0 — by now its sequence-parallel partial gradients
  have been summed, so every tp rank holds the same;
* the tied embedding's second copy on the last pipeline stage is not counted (both
  copies hold the summed gradient);
* data parallelism: whole gradients are the same on every dp×cp rank (an expert's on
  every rank of its expert-data-parallel group): counted on the first; ZeRO's shards are
  each a different slice: every rank counts its own;
* folded experts (`Mesh.fold`) are not copies over tp (each tp rank may hold others):
  counted on the first of `Mesh.expert_dp` only, and, split over etp, on every etp rank
  (a proj bias, whole over etp, on the first);
* the vocabulary's padding rows have zero gradients and count for nothing.

Each rank sums its counted squares in float64 and one all-reduce over every rank gives
the total: the step's one extra synchronization, which every pipeline stage must join
before any of them may step (Qi et al. 2024, §4, replace it by a post-validation: step
at once, check the norm after, and roll back the rare step that should have been
clipped). Clipping scales every gradient this rank's optimizer reads by
min(1, max_norm / (‖g‖ + 1e-6)), the coefficient ``clip_grad_norm_`` uses.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..data_parallel.zero import zero_stage_of
from ..mixed_precision import grad_of
from ..rules import model_chunks
from ..runtime import comm, trace
from ..runtime.mesh import Mesh, world
from ..sharding.tags import is_expert_shard, tag

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def clip_grad_norm(model, mesh: Mesh, optimizer, max_norm: float) -> float:
    """Scale the gradients so that their global norm is at most `max_norm`; returns the
    norm before clipping (the same float on every rank). Call it after the gradients are
    final (`mt.train_step` does, with ``clip_grad=max_norm``)."""
    if not max_norm > 0:
        raise ValueError(f"clip_grad must be > 0, got {max_norm}")
    grads = _counted_grads(model, mesh, optimizer)
    local = torch.zeros((), dtype=torch.float64, device=_device_of(model))
    for grad, weight in grads:
        squares = grad.detach().double().square()
        local += (squares * weight).sum() if torch.is_tensor(weight) else squares.sum() * weight
    with trace.label("grad norm"), trace.phase("bwd"):
        total = comm.all_reduce(local, world())
    norm = math.sqrt(float(total))
    coef = min(1.0, max_norm / (norm + EPS))
    if coef < 1.0:
        with torch.no_grad():
            for grad, _ in grads:
                grad.mul_(coef)
    return norm


def _device_of(model):
    return next(model.parameters()).device


def _tied_copies(model) -> set[int]:
    """The last stage's copy of the tied embedding (the first stage's counts)."""
    return {id(c.head.weight) for c in model_chunks(model) if c.last and not c.first}


def _counted(p: nn.Parameter, mesh: Mesh, tied: set[int], whole: bool) -> float:
    """1 if this rank counts parameter `p`'s gradient elements, else 0. `whole`: the
    gradient is the whole (dp-summed) one on every dp replica, not a ZeRO shard's."""
    if id(p) in tied:
        return 0.0
    if is_expert_shard(p):  # copies: expert_dp; tp unfolded; etp where whole over it
        copies = [mesh.expert_dp] if whole else []
        if not getattr(mesh, "fold", False):
            copies.append(mesh.tp)
        if tag(p, "etp_split_dim") is None and hasattr(mesh, "etp"):
            copies.append(mesh.etp)
    else:
        copies = ([mesh.dp_cp] if whole else []) + (
            [mesh.tp] if tag(p, "tp_split_dim") is None else [])
    return 1.0 if all(axis.rank == 0 for axis in copies) else 0.0


def _counted_grads(model, mesh: Mesh, optimizer) -> list[tuple[torch.Tensor, object]]:
    """(gradient tensor, weight: 0/1 or an elementwise 0/1 vector) for everything this
    rank's optimizer will read."""
    tied, stage = _tied_copies(model), zero_stage_of(model)
    if stage == 0:
        return [(g, _counted(p, mesh, tied, whole=True)) for p in model.parameters()
                if (g := grad_of(p)) is not None]
    if stage == 1:
        optimizer.reduce_grads()  # the reduce-scatter its step would do, done now
        return [(flat.shard.grad, _shard_weights(flat, flat.params,
                                                 flat.axis, mesh, tied))
                for flat in optimizer.flats]
    return [(u.shard.grad, _shard_weights(u, [p for _, _, p, _ in u.layout], u.dp, mesh, tied))
            for u in optimizer.units]


def _shard_weights(flat, params, axis, mesh: Mesh, tied: set[int]) -> torch.Tensor:
    """Per element of this rank's shard of a flat vector: 1 where counted, else 0."""
    cached = getattr(flat, "norm_weights", None)
    if cached is None:
        parts = [torch.full((p.numel() if p.numel() else _numel(flat, p),),
                            _counted(p, mesh, tied, whole=False), dtype=torch.float64,
                            device=flat.shard.device) for p in params]
        whole = torch.cat(parts)
        whole = torch.nn.functional.pad(whole, (0, flat.padded - whole.numel()))
        lo = axis.rank * flat.shard_size
        cached = flat.norm_weights = whole[lo:lo + flat.shard_size].clone()
    return cached


def _numel(unit, p) -> int:
    """A ZeRO-3 parameter is empty between uses: its size from the unit's layout."""
    for (_, _, q, _), shape in zip(unit.layout, unit.shapes, strict=True):
        if q is p:
            return math.prod(shape)
    raise KeyError("parameter not in its unit")
