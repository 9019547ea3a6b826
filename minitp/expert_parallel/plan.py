"""Expert parallelism applied to a (tensor-parallel) GPT's MoE layers, and the groups
their statistics are reduced over.

The layout (DeepSpeed-MoE's and Megatron-Core's default, without expert-TP):

* the ep group is folded into the data-parallel ranks: within each dp×cp group, runs
  of ep consecutive ranks share out the E experts, E/ep each (`Mesh.ep`); the ranks at
  the same place of every run hold the same experts and sum their gradients
  (`Mesh.expert_dp`, dp·cp/ep ranks) where dense parameters sum over all dp×cp;
* attention and everything dense stay as they were: data-parallel, and tensor-parallel
  over tp;
* experts are *not* split over tp: every tp rank holds its ep rank's whole experts.
  Without sequence parallelism the tp ranks hold the same tokens and run the same
  experts on them (repeated work, no communication); with it each tp rank routes its
  own slice of the sequence, so the tp ranks share the tokens out, and the experts'
  and router's gradients are partial over tp, summed like a LayerNorm's. (Megatron-Core's
  "parallel folding" would also fold ep into the tp ranks; minitp keeps ep ⊂ dp·cp.)

The statistics' groups, explicit because they are the usual bug:

* the aux loss and the capacity queue are per **sequence**: a rank sums its parts of
  each sequence's statistics over the ranks holding the other parts — tp under sequence
  parallelism, cp under context parallelism — and gathers the sequence's choices for
  the capacity queue (`SplitSequence`);
* the expert bias's load is per **step**: summed over every rank that saw other
  tokens — dp×cp, and tp under sequence parallelism — so the bias stays identical on
  every rank.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..context_parallel.split import gather_sequence, global_positions
from ..model.moe import Experts, WholeSequence, moe_layers
from ..runtime import comm, trace
from ..runtime.mesh import Axis, Mesh
from ..sharding.tags import set_tags
from ..tensor_parallel.mappings import reduce_from_parallel
from .dispatch import AllToAllDispatch


class SplitSequence(WholeSequence):
    """Where a rank holds part of each sequence: `sp_axis` (tp under sequence
    parallelism, else None) splits it contiguously, `cp` by context parallelism's
    chunks; `token_group` is dp×cp, the other ranks with other tokens."""

    def __init__(self, sp_axis: Axis | None, cp: Axis, token_group: Axis):
        super().__init__()
        self.sp_axis, self.cp, self.token_group = sp_axis, cp, token_group

    def _axes(self):
        return [a for a in (self.sp_axis, self.cp) if a is not None and a.size > 1]

    def sum(self, per_sequence: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks holding parts of each sequence (backward: identity, each
        rank's tokens get their own gradient)."""
        for axis in self._axes():
            with trace.label("moe sequence stats"):
                per_sequence = reduce_from_parallel(per_sequence, axis)
        return per_sequence

    def seq_len(self, local: int) -> int:
        return local * (self.sp_axis.size if self.sp_axis is not None else 1) * self.cp.size

    def whole(self, experts: torch.Tensor):
        local = experts.shape[1]
        with trace.label("moe capacity"):
            if self.sp_axis is not None:
                experts = comm.all_gather(experts, self.sp_axis, dim=1)
            experts = gather_sequence(experts, self.cp, dim=1)
        cp_local = local * (self.sp_axis.size if self.sp_axis is not None else 1)
        mine = (global_positions(cp_local, self.cp, experts.device) if self.cp.size > 1
                else torch.arange(cp_local, device=experts.device))
        if self.sp_axis is not None:
            mine = mine[self.sp_axis.rank * local:(self.sp_axis.rank + 1) * local]
        return experts, mine

    @torch.no_grad()
    def total(self, load: torch.Tensor) -> torch.Tensor:
        with trace.label("moe load"):
            load = comm.all_reduce(load, self.token_group)
            if self.sp_axis is not None:
                load = comm.all_reduce(load, self.sp_axis)
        return load


def shard_experts(dense: Experts, ep: Axis) -> Experts:
    """This ep rank's run of E/ep experts, its weights copied from the dense module."""
    n = dense.count // ep.size
    first = ep.rank * n
    shard = Experts.__new__(Experts)
    nn.Module.__init__(shard)
    shard.first, shard.count = dense.first + first, n
    for name in ("fc_weight", "proj_weight", "fc_bias", "proj_bias"):
        p = getattr(dense, name)
        if p is None:
            setattr(shard, name, None)
            continue
        part = nn.Parameter(p.detach()[first:first + n].clone())
        if ep.size > 1:
            set_tags(part, ep_split_dim=0)
        setattr(shard, name, part)
    return shard


def apply_expert_parallel(model: nn.Module, mesh: Mesh, sequence_parallel: bool) -> None:
    """Every MoE layer of `model` (changed in place) made this rank's: experts sharded
    over ``mesh.ep``, tokens exchanged by all-to-all, statistics over the groups above."""
    sp_axis = mesh.tp if sequence_parallel and mesh.tp.size > 1 else None
    for layer in moe_layers(model):
        layer.experts = shard_experts(layer.experts, mesh.ep)
        if mesh.ep.size > 1:
            layer.dispatch = AllToAllDispatch(mesh.ep)
        layer.sequence = SplitSequence(sp_axis, mesh.cp, mesh.dp_cp)
        if sp_axis is not None:  # each tp rank routed its own tokens: partial gradients
            for p in (layer.router.gate.weight, *layer.experts.parameters()):
                set_tags(p, grad_partial_over_tp=True)
