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

from ..rules import check_ep_divides_dp_cp, check_positive_int, check_world_size


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


def layout(dp: int = 1, pp: int = 1, tp: int = 1, *, cp: int = 1,
           ep: int = 1) -> dict[str, list[list[int]]]:
    """Every group of every dimension for a (dp, pp, cp, tp) mesh, without any processes.
    The "cp" and "dp_cp" groups are listed only when cp > 1; "ep" and "expert_dp" only
    when ep > 1: expert parallelism is folded into dp×cp, each dp_cp group cut into runs
    of ep consecutive ranks (an "ep" group shares out the experts), and "expert_dp" the
    ranks at the same place of every run (they hold the same experts).

    >>> layout(dp=2, pp=2, tp=2)["tp"]
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> layout(dp=2, cp=2)["cp"], layout(dp=2, cp=2)["dp_cp"]
    ([[0, 1], [2, 3]], [[0, 1, 2, 3]])
    >>> layout(dp=4, tp=2, ep=2)["ep"], layout(dp=4, tp=2, ep=2)["expert_dp"]
    ([[0, 2], [4, 6], [1, 3], [5, 7]], [[0, 4], [2, 6], [1, 5], [3, 7]])
    """
    _check_sizes(dp, pp, tp, cp)
    check_positive_int("ep", ep)
    check_ep_divides_dp_cp(ep, dp, cp)
    grid = torch.arange(dp * pp * cp * tp).reshape(pp, dp, cp, tp)  # tp fastest, then cp
    groups = {
        "tp": grid.reshape(-1, tp).tolist(),
        "dp": grid.permute(0, 2, 3, 1).reshape(-1, dp).tolist(),  # (pp, cp, tp, dp)
        "pp": grid.permute(1, 2, 3, 0).reshape(-1, pp).tolist(),  # (dp, cp, tp, pp)
    }
    if cp > 1:
        groups["cp"] = grid.permute(0, 1, 3, 2).reshape(-1, cp).tolist()  # (pp, dp, tp, cp)
        groups["dp_cp"] = grid.permute(0, 3, 1, 2).reshape(-1, dp * cp).tolist()  # (pp, tp, dp·cp)
    if ep > 1:
        dp_cp = grid.permute(0, 3, 1, 2).reshape(-1, dp * cp // ep, ep)  # (pp·tp, runs, ep)
        groups["ep"] = dp_cp.reshape(-1, ep).tolist()
        groups["expert_dp"] = dp_cp.transpose(1, 2).reshape(-1, dp * cp // ep).tolist()
    return groups


class Mesh:
    """The (dp, pp, cp, tp) rank grid of a launched run, one `Axis` per dimension.

    Create it inside a launched function, on every rank, with the same sizes;
    ``dp * pp * cp * tp`` must equal the world size (cp, context parallelism, is
    1 unless given, by keyword). ``ranks`` (e.g. ``range(4, 6)``) lays the grid on part
    of the world instead, built by those ranks only: a generator's ranks beside its
    trainer's; ``mesh.all`` is then the grid's group, not the world's. A 16-rank example,
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
    """

    def __init__(self, dp: int = 1, pp: int = 1, tp: int = 1, *, cp: int = 1, ep: int = 1,
                 ranks=None):
        _check_sizes(dp, pp, tp, cp)
        _require_initialized("mt.Mesh(...)")
        me, everyone = dist.get_rank(), dist.get_world_size()
        # the global ranks the grid spans, in grid order: the whole world, or (``ranks``) a
        # part of it, e.g. a generator's beside its trainer's (`minitp.serving.refit`)
        self.ranks = _check_ranks(ranks, everyone, me)
        world_size = len(self.ranks)
        check_world_size(world_size, dp=dp, pp=pp, cp=cp, tp=tp)
        self.dp_size, self.pp_size, self.cp_size, self.tp_size = dp, pp, cp, tp
        self.ep_size = ep
        self.rank = me
        self.world_size = world_size
        axes = {}
        for name, groups in layout(dp, pp, tp, cp=cp, ep=ep).items():
            mine = None
            for index in groups:  # every rank must create every group, in the same order
                ranks_ = [self.ranks[i] for i in index]
                group = self.new_group(ranks_)
                if me in ranks_:
                    mine = Axis(name, tuple(ranks_), ranks_.index(me), group)
            axes[name] = mine
        self.tp: Axis = axes["tp"]
        self.dp: Axis = axes["dp"]
        self.pp: Axis = axes["pp"]
        # one rank, no group: an axis of one rank never communicates (`minitp.runtime.comm`)
        self.cp: Axis = axes.get("cp", Axis("cp", (me,), 0, None))
        self.dp_cp: Axis = axes.get("dp_cp", self.dp)
        # expert parallelism (`minitp.expert_parallel`): the ranks that share out the
        # experts, and those holding the same ones (whose expert gradients are summed)
        self.ep: Axis = axes.get("ep", Axis("ep", (me,), 0, None))
        self.expert_dp: Axis = axes.get("expert_dp", self.dp_cp)
        # every rank of the grid (the world's group, unless the grid spans only part of it)
        self.all: Axis = Axis("mesh", self.ranks, self.ranks.index(me),
                              self.new_group(list(self.ranks)))

    def new_group(self, ranks: list[int]):
        """A process group over `ranks` (global, ascending, inside the grid). On a grid over
        the whole world every rank creates every group, in the same order (as
        ``dist.new_group`` requires); on a grid over part of it only the grid's ranks
        build it, so each creates just its own groups (torch's local synchronization: the
        ranks outside never call) and gets None for the others."""
        if len(ranks) == dist.get_world_size():
            return dist.group.WORLD
        if len(self.ranks) == dist.get_world_size():
            return dist.new_group(ranks)
        if self.rank not in ranks:
            return None
        return dist.new_group(ranks, use_local_synchronization=True)

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
            + ("" if self.all.group is dist.group.WORLD else f", ranks {list(self.ranks)}")
            + f") on rank {self.rank}: "
            f"tp {self.tp.rank}/{self.tp.size} {list(self.tp.ranks)}, "
            + (f"cp {self.cp.rank}/{self.cp.size} {list(self.cp.ranks)}, " if cp else "")
            + f"dp {self.dp.rank}/{self.dp.size} {list(self.dp.ranks)}, "
            f"pp stage {self.pp.rank}/{self.pp.size} {list(self.pp.ranks)}"
        )


def _check_sizes(dp, pp, tp, cp=1) -> None:
    for name, value in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
        check_positive_int(name, value)


def _check_ranks(ranks, everyone: int, me: int) -> tuple[int, ...]:
    """The grid's global ranks: all of them by default, else `ranks` ascending, distinct,
    in the world, and holding the calling rank; ValueError otherwise."""
    if ranks is None:
        return tuple(range(everyone))
    try:
        out = tuple(int(r) for r in ranks)
    except TypeError:
        raise TypeError(f"Mesh ranks must be a sequence of global ranks (e.g. range(2, 4)), "
                        f"got {type(ranks).__name__}") from None
    if not out or list(out) != sorted(set(out)) or out[0] < 0 or out[-1] >= everyone:
        raise ValueError(f"Mesh ranks {list(out)}: distinct ascending ranks in 0..{everyone - 1} "
                         "expected (the launch's world)")
    if me not in out:
        raise ValueError(f"rank {me} built a Mesh over ranks {list(out)}: only the ranks a grid "
                         "spans build it (the others pass None where it is asked for)")
    return out


def _require_initialized(what: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what} needs a running process group: call it inside a function "
            "started by mt.launch(fn, world_size) (or under torchrun)"
        )
