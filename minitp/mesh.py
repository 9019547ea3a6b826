"""The device mesh: a grid of ranks with one process group per dimension.

Ranks are laid out as Megatron-LM lays them out: tensor-parallel rank fastest,
then data-parallel, then pipeline. Adjacent ranks (adjacent GPUs of one node)
therefore share a tensor-parallel group, the one that talks most.

    rank = pp_index * (dp * tp) + dp_index * tp + tp_index

The groups come from reshaping ``arange(world)`` into the grid (pp, dp, tp) and
reading it along each dimension. Nothing here is global: every group lives in
the `Mesh` object the caller holds and passes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


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


def layout(dp: int = 1, pp: int = 1, tp: int = 1) -> dict[str, list[list[int]]]:
    """Every group of every dimension for a (dp, pp, tp) mesh, without any processes.

    >>> layout(dp=2, pp=2, tp=2)["tp"]
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    _check_sizes(dp, pp, tp)
    grid = torch.arange(dp * pp * tp).reshape(pp, dp, tp)  # (pp, dp, tp): tp fastest
    return {
        "tp": grid.reshape(-1, tp).tolist(),
        "dp": grid.permute(0, 2, 1).reshape(-1, dp).tolist(),  # (pp, tp, dp)
        "pp": grid.permute(1, 2, 0).reshape(-1, pp).tolist(),  # (dp, tp, pp)
    }


class Mesh:
    """The (dp, pp, tp) rank grid of a launched run, one `Axis` per dimension.

    Create it inside a launched function, on every rank, with the same sizes;
    ``dp * pp * tp`` must equal the world size. A 16-rank example,
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
    """

    def __init__(self, dp: int = 1, pp: int = 1, tp: int = 1):
        _check_sizes(dp, pp, tp)
        _require_initialized("mt.Mesh(...)")
        world_size = dist.get_world_size()
        if dp * pp * tp != world_size:
            raise ValueError(
                f"Mesh(dp={dp}, pp={pp}, tp={tp}) needs dp*pp*tp = {dp * pp * tp} ranks, "
                f"but this run has world size {world_size}"
            )
        self.dp_size, self.pp_size, self.tp_size = dp, pp, tp
        me = dist.get_rank()
        axes = {}
        for name, groups in layout(dp, pp, tp).items():
            mine = None
            for ranks in groups:  # every rank must create every group, in the same order
                group = dist.new_group(ranks) if len(ranks) < world_size else dist.group.WORLD
                if me in ranks:
                    mine = Axis(name, tuple(ranks), ranks.index(me), group)
            axes[name] = mine
        self.tp: Axis = axes["tp"]
        self.dp: Axis = axes["dp"]
        self.pp: Axis = axes["pp"]
        self.rank = me
        self.world_size = world_size

    @property
    def coords(self) -> dict[str, int]:
        """This rank's position: its index along each axis."""
        return {"dp": self.dp.rank, "pp": self.pp.rank, "tp": self.tp.rank}

    def __repr__(self) -> str:
        return (
            f"Mesh(dp={self.dp_size}, pp={self.pp_size}, tp={self.tp_size}) on rank {self.rank}: "
            f"tp {self.tp.rank}/{self.tp.size} {list(self.tp.ranks)}, "
            f"dp {self.dp.rank}/{self.dp.size} {list(self.dp.ranks)}, "
            f"pp stage {self.pp.rank}/{self.pp.size} {list(self.pp.ranks)}"
        )


def _check_sizes(dp, pp, tp) -> None:
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _require_initialized(what: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what} needs a running process group: call it inside a function "
            "started by mt.launch(fn, world_size) (or under torchrun)"
        )
