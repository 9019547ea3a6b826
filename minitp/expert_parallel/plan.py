"""Expert parallelism applied to a (tensor-parallel) GPT's MoE layers, and the groups
their statistics are reduced over.

Two layouts of the experts over a pipeline stage's dp·cp·tp ranks (`Mesh`, and the one
rule that says which each mesh allows, `minitp.rules.check_expert_mesh`):

* **unfolded** (the default; DeepSpeed-MoE's layout): the ep group lives in the
  data-parallel ranks: within each dp×cp group, runs of ep consecutive ranks share out
  the E experts, E/ep each (`Mesh.ep`); the ranks at the same place of every run hold the
  same experts and sum their gradients (`Mesh.expert_dp`, dp·cp/ep ranks). Experts are
  *not* split over tp: every tp rank holds its ep rank's whole experts. Without sequence
  parallelism the tp ranks hold the same tokens and run the same experts on them: every
  routed token's expert work is done tp times (`minitp.rules.expert_compute_copies`).
  With it each tp rank routes its own slice of the sequence, and the experts' and
  router's gradients are partial over tp, summed like a LayerNorm's.
* **folded** (``Mesh(..., fold=True)`` or etp > 1; Megatron-Core's "parallel folding",
  arXiv 2504.14960): the experts factor the stage's ranks afresh as etp × ep × edp, so ep
  may span tp and cp. Each tp rank routes only its own 1/tp of the sequence: under
  sequence parallelism the slice it already holds; without it, the MoE layer takes its
  slice on the way in and all-gathers the outputs on the way out (`SplitSequence.mine`,
  `restore`: forward slice / backward all-gather, and its adjoint), so no routed token
  is computed twice. The experts' gradients are complete on the ranks that hold them and
  summed over `Mesh.expert_dp` (edp ranks, tp positions included). With etp > 1 each
  expert's hidden width is split over `Mesh.etp` (`ExpertSlice`), and the tokens that
  reached an ep rank are gathered over etp and their partial outputs summed back
  (`minitp.expert_parallel.dispatch`). Attention and everything dense are unchanged.

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
from ..tensor_parallel.mappings import (
    gather_from_sequence,
    reduce_from_parallel,
    scatter_to_sequence,
)
from .dispatch import AllToAllDispatch
from .slices import ExpertSlice, expert_slice


class SplitSequence(WholeSequence):
    """Where a rank holds part of each sequence: `sp_axis` (tp under sequence
    parallelism or folding, else None) splits it contiguously, `cp` by context
    parallelism's chunks; `token_group` is dp×cp, the other ranks with other tokens.
    `slice_axis` (folded without sequence parallelism: tp): the MoE layer's input is the
    whole sequence on every rank of it, and each routes only its own contiguous slice."""

    def __init__(self, sp_axis: Axis | None, cp: Axis, token_group: Axis,
                 slice_axis: Axis | None = None):
        super().__init__()
        self.sp_axis, self.cp, self.token_group = sp_axis, cp, token_group
        self.slice_axis = slice_axis

    def mine(self, x: torch.Tensor) -> torch.Tensor:
        if self.slice_axis is None:
            return x
        if x.shape[1] % self.slice_axis.size:
            raise ValueError(f"folded experts route a 1/tp slice of the sequence each: "
                             f"{x.shape[1]} positions cannot be split across "
                             f"tp={self.slice_axis.size}")
        with trace.label("moe slice"):  # forward: keep my slice · backward: all-gather
            return scatter_to_sequence(x, self.slice_axis)

    def restore(self, out: torch.Tensor) -> torch.Tensor:
        if self.slice_axis is None:
            return out
        with trace.label("moe gather"):  # the downstream gradient is replicated over tp
            return gather_from_sequence(out, self.slice_axis, grad_is_partial=False)

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


def shard_experts(dense: Experts, ep: Axis, etp: Axis | None = None,
                  expert_shard: bool | None = None) -> Experts:
    """This ep rank's run of E/ep experts (and, with etp > 1, this etp rank's slice of each
    one's hidden width: `minitp.expert_parallel.slices`), its weights copied from the dense
    module. `expert_shard`: tag it as such (its gradients summed over `Mesh.expert_dp`);
    None: where ep > 1."""
    n = dense.count // ep.size
    first = ep.rank * n
    parts = etp.size if etp is not None else 1
    kind = ExpertSlice if parts > 1 else Experts
    shard = kind.__new__(kind)
    nn.Module.__init__(shard)
    shard.first, shard.count, shard.parts = dense.first + first, n, parts
    tag_it = ep.size > 1 if expert_shard is None else expert_shard
    for name in ("fc_weight", "proj_weight", "fc_bias", "proj_bias"):
        p = getattr(dense, name)
        if p is None:
            setattr(shard, name, None)
            continue
        value, dim = expert_slice(name, p.detach()[first:first + n], etp)
        part = nn.Parameter(value.clone())
        if tag_it:
            set_tags(part, ep_split_dim=0)
        if dim is not None:
            set_tags(part, etp_split_dim=dim)
        setattr(shard, name, part)
    return shard


def apply_expert_parallel(model: nn.Module, mesh: Mesh, sequence_parallel: bool) -> None:
    """Every MoE layer of `model` (changed in place) made this rank's: experts sharded
    over ``mesh.ep`` (and ``mesh.etp``), tokens exchanged by all-to-all, statistics over
    the groups above."""
    tp = mesh.tp if mesh.tp.size > 1 else None
    fold = getattr(mesh, "fold", False)
    sp_axis = tp if sequence_parallel or fold else None
    slice_axis = tp if fold and not sequence_parallel else None
    etp = getattr(mesh, "etp", None)
    for layer in moe_layers(model):
        layer.experts = shard_experts(layer.experts, mesh.ep, etp,
                                      expert_shard=fold or mesh.ep.size > 1)
        if mesh.ep.size > 1 or layer.experts.parts > 1:
            layer.dispatch = AllToAllDispatch(mesh.ep, etp)
        layer.sequence = SplitSequence(sp_axis, mesh.cp, mesh.dp_cp, slice_axis)
        if sp_axis is not None:  # each tp rank routed its own tokens: partial gradients
            set_tags(layer.router.gate.weight, grad_partial_over_tp=True)
            if not fold:  # unfolded, the tp ranks hold the same experts: sum over tp too
                for p in layer.experts.parameters():
                    set_tags(p, grad_partial_over_tp=True)
