"""The device mesh: a grid of ranks with one process group per dimension.

Ranks are laid out as Megatron-LM lays them out: tensor-parallel rank fastest,
then context-parallel, then data-parallel, then pipeline (Megatron-Core's order
"tp-cp-ep-dp-pp", fastest first, without experts). Adjacent ranks (adjacent GPUs
of one node) therefore share a tensor-parallel group, the one that talks most;
the context-parallel ring, which talks next most, comes next.

    rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index

With cp = 1 (the default) this is pp_index·(dp·tp) + dp_index·tp + tp_index, the
(dp, pp, tp) layout unchanged. The groups come from reshaping ``arange(world)``
into the grid (pp, dp, cp, tp) and reading it along each dimension. One more
group: ``dp_cp``, the data- and context-parallel ranks together, over which the
gradients of parameters replicated on both are summed (Megatron's
"data-parallel group with context parallelism"). Nothing here is global: every
group lives in the `Mesh` object the caller holds and passes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..rules import check_expert_mesh, check_positive_int, check_world_size, folded


@dataclass(frozen=True)
class Axis:
    """One dimension of the mesh as seen from one rank.

    ``ranks`` are the global ranks of this rank's group, in axis order;
    ``rank`` is this rank's index in it; ``group`` is the process group to pass
    to collectives (None means the default, world, group).
    """

    name: str
    ranks: tuple[int, ...]
    rank: int
    group: object = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def global_rank(self) -> int:
        return self.ranks[self.rank]

    # Pipeline neighbours. They wrap around, as Megatron-LM's do, so that an
    # interleaved schedule can pass activations from the last stage to the first.
    @property
    def prev(self) -> int:
        """Global rank of the previous stage on this axis (wraps around)."""
        return self.ranks[(self.rank - 1) % self.size]

    @property
    def next(self) -> int:
        """Global rank of the next stage on this axis (wraps around)."""
        return self.ranks[(self.rank + 1) % self.size]

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def __repr__(self) -> str:
        return f"Axis({self.name}: rank {self.rank} of {self.size}, ranks {list(self.ranks)})"


def world() -> Axis:
    """The whole world as one axis (every rank, the default process group)."""
    _require_initialized("minitp.world()")
    size = dist.get_world_size()
    return Axis("world", tuple(range(size)), dist.get_rank(), None)


def layout(dp: int = 1, pp: int = 1, tp: int = 1, *, cp: int = 1, ep: int = 1, etp: int = 1,
           fold: bool = False) -> dict[str, list[list[int]]]:
    """Every group of every dimension for a (dp, pp, cp, tp) mesh, without any processes.
    The "cp" and "dp_cp" groups are listed only when cp > 1; "ep" and "expert_dp" only
    when ep > 1 or folded, "etp" only when etp > 1. Which (ep, etp) a mesh allows:
    `minitp.rules.check_expert_mesh` (all of them: `minitp.rules.expert_meshes`).

    Unfolded (the default): expert parallelism lives in dp×cp, each dp_cp group cut into
    runs of ep consecutive ranks (an "ep" group shares out the experts), "expert_dp" the
    ranks at the same place of every run (they hold the same experts).

    Folded (``fold=True``, implied by etp > 1; Megatron-Core's "parallel folding"): the
    experts factor each pipeline stage's dp·cp·tp ranks afresh, in rank order, as
    (edp, ep, etp) with etp fastest (Megatron-Core's expert order "tp-ep-dp"), so an
    "ep" group may span tp and cp.

    >>> layout(dp=2, pp=2, tp=2)["tp"]
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> layout(dp=2, cp=2)["cp"], layout(dp=2, cp=2)["dp_cp"]
    ([[0, 1], [2, 3]], [[0, 1, 2, 3]])
    >>> layout(dp=4, tp=2, ep=2)["ep"], layout(dp=4, tp=2, ep=2)["expert_dp"]
    ([[0, 2], [4, 6], [1, 3], [5, 7]], [[0, 4], [2, 6], [1, 5], [3, 7]])
    >>> layout(dp=2, tp=2, ep=4, fold=True)["ep"]
    [[0, 1, 2, 3]]
    >>> g = layout(dp=2, tp=2, ep=2, etp=2)
    >>> g["etp"], g["ep"], g["expert_dp"]
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1], [2], [3]])
    """
    _check_sizes(dp, pp, tp, cp)
    check_positive_int("ep", ep)
    check_positive_int("etp", etp)
    check_expert_mesh(ep, dp, cp, tp, etp, fold)
    grid = torch.arange(dp * pp * cp * tp).reshape(pp, dp, cp, tp)  # tp fastest, then cp
    groups = {
        "tp": grid.reshape(-1, tp).tolist(),
        "dp": grid.permute(0, 2, 3, 1).reshape(-1, dp).tolist(),  # (pp, cp, tp, dp)
        "pp": grid.permute(1, 2, 3, 0).reshape(-1, pp).tolist(),  # (dp, cp, tp, pp)
    }
    if cp > 1:
        groups["cp"] = grid.permute(0, 1, 3, 2).reshape(-1, cp).tolist()  # (pp, dp, tp, cp)
        groups["dp_cp"] = grid.permute(0, 3, 1, 2).reshape(-1, dp * cp).tolist()  # (pp, tp, dp·cp)
    if folded(etp, fold):
        experts = grid.reshape(pp, -1, ep, etp)  # (pp, edp, ep, etp): the stage in rank order
        edp = experts.shape[1]
        if etp > 1:
            groups["etp"] = experts.reshape(-1, etp).tolist()
        groups["ep"] = experts.permute(0, 1, 3, 2).reshape(-1, ep).tolist()
        groups["expert_dp"] = experts.permute(0, 2, 3, 1).reshape(-1, edp).tolist()
    elif ep > 1:
        dp_cp = grid.permute(0, 3, 1, 2).reshape(-1, dp * cp // ep, ep)  # (pp·tp, runs, ep)
        groups["ep"] = dp_cp.reshape(-1, ep).tolist()
        groups["expert_dp"] = dp_cp.transpose(1, 2).reshape(-1, dp * cp // ep).tolist()
    return groups


class Mesh:
    """The (dp, pp, cp, tp) rank grid of a launched run, one `Axis` per dimension.

    Create it inside a launched function, on every rank, with the same sizes;
    ``dp * pp * cp * tp`` must equal the world size (cp, context parallelism, is
    1 unless given, by keyword). A 16-rank example,
    ``Mesh(dp=2, pp=4, tp=2)``, has these groups (the same as the worked
    example in Megatron-LM's ``initialize_model_parallel``):

    tensor-parallel (8 groups of 2, adjacent ranks)::

        [0, 1] [2, 3] [4, 5] [6, 7] [8, 9] [10, 11] [12, 13] [14, 15]

    data-parallel (8 groups of 2, ranks tp apart)::

        [0, 2] [1, 3] [4, 6] [5, 7] [8, 10] [9, 11] [12, 14] [13, 15]

    pipeline (4 groups of 4, ranks dp*tp apart; stage order along each list)::

        [0, 4, 8, 12] [1, 5, 9, 13] [2, 6, 10, 14] [3, 7, 11, 15]

    Rank 5 is therefore tp rank 1, dp rank 0, pipeline stage 1: its neighbours
    are ``mesh.pp.prev == 1`` and ``mesh.pp.next == 9``.

    With context parallelism, ``Mesh(dp=2, pp=2, cp=2, tp=2)`` on 16 ranks,
    rank = ((pp_index·dp + dp_index)·cp + cp_index)·tp + tp_index:

    tensor-parallel (8 groups of 2, adjacent ranks)::

        [0, 1] [2, 3] [4, 5] [6, 7] [8, 9] [10, 11] [12, 13] [14, 15]

    context-parallel (8 rings of 2, ranks tp apart; ring order along each list)::

        [0, 2] [1, 3] [4, 6] [5, 7] [8, 10] [9, 11] [12, 14] [13, 15]

    data-parallel (8 groups of 2, ranks cp*tp apart)::

        [0, 4] [1, 5] [2, 6] [3, 7] [8, 12] [9, 13] [10, 14] [11, 15]

    pipeline (8 groups of 2, ranks dp*cp*tp apart)::

        [0, 8] [1, 9] [2, 10] [3, 11] [4, 12] [5, 13] [6, 14] [7, 15]

    data × context (``mesh.dp_cp``, 4 groups of 4: the gradient-sum group)::

        [0, 2, 4, 6] [1, 3, 5, 7] [8, 10, 12, 14] [9, 11, 13, 15]

    Rank 11 is tp rank 1, cp rank 1, dp rank 0, stage 1: its ring neighbours are
    ``mesh.cp.prev == mesh.cp.next == 9``. With cp = 1, ``mesh.cp`` is an axis
    of one rank (it talks to nobody) and ``mesh.dp_cp`` is ``mesh.dp`` itself.

    A mixture of experts' layout (`layout`'s "ep", "etp", "expert_dp"): ``ep=`` alone
    shares the experts out inside dp×cp; ``fold=True`` (implied by ``etp=`` > 1) gives the
    experts their own factorisation etp × ep × edp of each stage's ranks, so ep may span
    tp (``mesh.ep``, ``mesh.etp``, ``mesh.expert_dp``; ``mesh.fold`` says which).
    """

    def __init__(self, dp: int = 1, pp: int = 1, tp: int = 1, *, cp: int = 1, ep: int = 1,
                 etp: int = 1, fold: bool = False):
        _check_sizes(dp, pp, tp, cp)
        _require_initialized("mt.Mesh(...)")
        world_size = dist.get_world_size()
        check_world_size(world_size, dp=dp, pp=pp, cp=cp, tp=tp)
        self.dp_size, self.pp_size, self.cp_size, self.tp_size = dp, pp, cp, tp
        self.ep_size, self.etp_size, self.fold = ep, etp, folded(etp, fold)
        me = dist.get_rank()
        axes = {}
        for name, groups in layout(dp, pp, tp, cp=cp, ep=ep, etp=etp, fold=fold).items():
            mine = None
            for ranks in groups:  # every rank must create every group, in the same order
                group = dist.new_group(ranks) if len(ranks) < world_size else dist.group.WORLD
                if me in ranks:
                    mine = Axis(name, tuple(ranks), ranks.index(me), group)
            axes[name] = mine
        self.tp: Axis = axes["tp"]
        self.dp: Axis = axes["dp"]
        self.pp: Axis = axes["pp"]
        # one rank, no group: an axis of one rank never communicates (`minitp.runtime.comm`)
        self.cp: Axis = axes.get("cp", Axis("cp", (me,), 0, None))
        self.dp_cp: Axis = axes.get("dp_cp", self.dp)
        # expert parallelism (`minitp.expert_parallel`): the ranks that share out the
        # experts, those that split each expert (etp, folded only), and those holding the
        # same ones (whose expert gradients are summed). Folded, with ep = etp = 1, every
        # rank of the stage holds all the experts: expert_dp is the whole stage.
        self.ep: Axis = axes.get("ep", Axis("ep", (me,), 0, None))
        self.etp: Axis = axes.get("etp", Axis("etp", (me,), 0, None))
        self.expert_dp: Axis = axes.get("expert_dp", self.dp_cp)
        self.rank = me
        self.world_size = world_size

    @property
    def coords(self) -> dict[str, int]:
        """This rank's position: its index along each axis (cp only when cp > 1)."""
        coords = {"dp": self.dp.rank, "pp": self.pp.rank, "tp": self.tp.rank}
        if self.cp_size > 1:
            coords["cp"] = self.cp.rank
        return coords

    def __repr__(self) -> str:
        cp = self.cp_size > 1
        return (
            f"Mesh(dp={self.dp_size}, pp={self.pp_size}, "
            + (f"cp={self.cp_size}, " if cp else "")
            + f"tp={self.tp_size}"
            + (f", ep={self.ep_size}" if self.ep_size > 1 else "")
            + (f", etp={self.etp_size}" if self.etp_size > 1 else "")
            + (", fold=True" if self.fold else "") + f") on rank {self.rank}: "
            f"tp {self.tp.rank}/{self.tp.size} {list(self.tp.ranks)}, "
            + (f"cp {self.cp.rank}/{self.cp.size} {list(self.cp.ranks)}, " if cp else "")
            + f"dp {self.dp.rank}/{self.dp.size} {list(self.dp.ranks)}, "
            f"pp stage {self.pp.rank}/{self.pp.size} {list(self.pp.ranks)}"
        )


def _check_sizes(dp, pp, tp, cp=1) -> None:
    for name, value in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
        check_positive_int(name, value)


def _require_initialized(what: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what} needs a running process group: call it inside a function "
            "started by mt.launch(fn, world_size) (or under torchrun)"
        )
