"""minitp's `Mesh` as PyTorch's `DeviceMesh`: the same ranks, the same groups, named dims.

A `DeviceMesh` is an n-dimensional array of global ranks with one process group per
dimension, each dimension named. minitp's `Mesh` is the same thing spelled out: for a
(dp, tp) run (pp = cp = 1) the ranks are ``arange(world).reshape(dp, tp)``, tensor-parallel
rank fastest, and ``mesh.dp.group`` / ``mesh.tp.group`` are the groups along each
dimension. `DeviceMesh.from_group` wraps those very groups (no new process group, no
collective), so a collective torch issues on ``dm["tp"]`` goes through the group minitp's
``mesh.tp`` uses.

HSDP (hybrid sharding) needs the data-parallel axis cut in two: ``replicas`` groups of
``dp / replicas`` consecutive data-parallel ranks. Parameters are sharded inside a group
(``dp_shard``, the ranks of one node on a real cluster) and replicated across groups
(``dp_replicate``). minitp's `Mesh` has no such groups, so they are made here, with
``dist.new_group`` on every rank (every rank must create every group, in the same order).
The names are torchtitan's (``torchtitan/distributed/parallel_dims.py``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..rules.torch_parallel import check_torch_mesh
from ..runtime.mesh import Mesh

DEVICE_TYPE = "cpu"


def _device_type() -> str:
    """"cuda" when the ranks run NCCL on GPUs, else "cpu" (gloo)."""
    backend = dist.get_backend()
    return "cuda" if backend == "nccl" else DEVICE_TYPE


def _new_groups(grid: torch.Tensor, my_rank: int):
    """One process group per row of `grid` (2-D, rows = groups), made on every rank;
    returns the one holding `my_rank`."""
    mine = None
    for row in grid.tolist():
        group = dist.new_group(row)
        if my_rank in row:
            mine = group
    return mine


def device_mesh(mesh: Mesh, hsdp: int | None = None) -> DeviceMesh:
    """`mesh` as a DeviceMesh over the same ranks: dims ("dp", "tp"), or with ``hsdp=R``
    ("dp_replicate", "dp_shard", "tp"), R replicas of dp/R shards each. Dimensions of
    size 1 are kept (a placement list then names every axis, as torchtitan's do)."""
    check_torch_mesh(mesh.dp.size, mesh.pp.size, mesh.cp.size, mesh.tp.size, hsdp)
    dp, tp = mesh.dp.size, mesh.tp.size
    device = _device_type()
    if not hsdp:
        ranks = torch.arange(dp * tp).reshape(dp, tp)
        return DeviceMesh.from_group([mesh.dp.group, mesh.tp.group], device, mesh=ranks,
                                     mesh_dim_names=("dp", "tp"))
    shard = dp // hsdp
    ranks = torch.arange(dp * tp).reshape(hsdp, shard, tp)
    me = dist.get_rank()
    replicate_group = _new_groups(ranks.permute(1, 2, 0).reshape(-1, hsdp), me)
    shard_group = _new_groups(ranks.permute(0, 2, 1).reshape(-1, shard), me)
    return DeviceMesh.from_group([replicate_group, shard_group, mesh.tp.group], device,
                                 mesh=ranks, mesh_dim_names=("dp_replicate", "dp_shard", "tp"))


def data_dims(dm: DeviceMesh) -> tuple[str, ...]:
    """The names of `dm`'s data-parallel dimensions, outermost first."""
    return tuple(n for n in dm.mesh_dim_names if n.startswith("dp"))
