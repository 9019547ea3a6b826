"""What `minitp.serving.refit` refuses, and how every rank of the launch comes to refuse
alike: each rank checks its own part (its trained shard, its serving grid, the config),
then every rank's answer is shared (`agree`: pickled over the world, bookkeeping left out
of the trace) before any rank sends a byte, so that no rank is left waiting in a message
another rank refused. Also where a separate generator's ranks go (`serving_ranks`)."""

from __future__ import annotations

import torch.distributed as dist

from ..rules import check_tp_widths
from ..runtime.mesh import Mesh


def check_refit(model, target_mesh, cfg=None) -> None:
    """One line for what `refit` cannot do with this rank's part (`model`: its trained
    shard or None; `target_mesh`: its serving grid or None; `cfg`: the config where it has
    no model); `Refit` shares the answer before any rank sends a byte."""
    if model is not None and not (hasattr(model, "full_state_dict")
                                  and isinstance(getattr(model, "mesh", None), Mesh)):
        raise TypeError(f"refit expects a model from mt.parallelize, got "
                        f"{type(model).__name__}: parallelize it first")
    if target_mesh is not None and not isinstance(target_mesh, Mesh):
        raise TypeError(f"refit's target must be an mt.Mesh, got {type(target_mesh).__name__}")
    if model is None and target_mesh is not None and cfg is None:
        raise ValueError("refit: a rank that serves without training passes the model's "
                         "config (Refit.for_generator(cfg, target_mesh))")
    if target_mesh is None:
        return
    if target_mesh.cp_size != 1 or target_mesh.ep_size != 1:
        raise ValueError(f"refit serves on tp and pp (with dp replicas) only, got "
                         f"{target_mesh!r}")
    check_tp_widths(model.cfg if model is not None else cfg, target_mesh.tp_size)


def agree(mine: tuple) -> list[tuple]:
    """Every rank's (error, *facts), on every rank (pickled over the world: bookkeeping,
    out of the trace); the first error raised on every rank alike (its type and line)."""
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for rank, (error, *_) in enumerate(every):
        if error is not None:
            kind, said = error
            raise (TypeError if kind == "TypeError" else ValueError)(
                said if rank == dist.get_rank() else f"{said} (rank {rank})")
    return every


def refusal(check) -> tuple | None:
    try:
        check()
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)
    return None


def serving_ranks(world_size: int, train: int, serve: int,
                  placement: str = "separate") -> range:
    """Where a generator of `serve` ranks goes beside a trainer on ranks 0..train−1 of a
    launch of `world_size`: "collocated", on the trainer's ranks (serve == train), or
    "separate", on the ranks after them. ValueError in one line where it cannot."""
    if placement == "collocated":
        if serve != train:
            raise ValueError(f"collocated serving runs on the trainer's {train} ranks, got a "
                             f"serving layout of {serve}")
        return range(train)
    if placement != "separate":
        raise ValueError(f"placement must be 'collocated' or 'separate', got {placement!r}")
    if train + serve > world_size:
        raise ValueError(f"separate serving ranks: {train} training + {serve} serving ranks "
                         f"= {train + serve}, but the world holds {world_size}")
    return range(train, train + serve)


def check_facts(facts) -> None:
    """Every rank's config alike, one dtype over the trainers, and at least one of each."""
    cfgs = {repr(f[1]) for f in facts if f[1] is not None}
    if len(cfgs) > 1:
        raise ValueError(f"refit: the ranks hold {len(cfgs)} different model configs: every "
                         "rank passes the trainer's")
    if len({f[2] for f in facts if f[2] is not None}) > 1:
        raise ValueError("refit: the trainer's ranks hold different dtypes")
    if all(f[2] is None for f in facts):
        raise ValueError("refit: no rank passed a trained model")
