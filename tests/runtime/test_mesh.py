"""The device mesh: Megatron's rank layout (tp fastest, then cp, then dp, then pp), the axes
each rank sees, and collectives that stay inside their group."""

from __future__ import annotations

import itertools
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import minitp as mt

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def coords_of(rank: int, dp: int, pp: int, tp: int) -> tuple[int, int, int]:
    """(pp_index, dp_index, tp_index) from rank = pp_index*(dp*tp) + dp_index*tp + tp_index."""
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def rank_of(pp_i: int, dp_i: int, tp_i: int, dp: int, tp: int) -> int:
    return pp_i * (dp * tp) + dp_i * tp + tp_i


def expected_groups(dp: int, pp: int, tp: int, rank: int) -> dict[str, list[int]]:
    """The group of `rank` along each axis, straight from the formula."""
    p, d, t = coords_of(rank, dp, pp, tp)
    return {
        "tp": [rank_of(p, d, i, dp, tp) for i in range(tp)],
        "dp": [rank_of(p, i, t, dp, tp) for i in range(dp)],
        "pp": [rank_of(i, d, t, dp, tp) for i in range(pp)],
    }


# --------------------------------------------------------------------------- layout
def test_layout_is_the_16_rank_example_of_the_docstring():
    groups = mt.layout(dp=2, pp=4, tp=2)
    assert groups == {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "dp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
        "pp": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
    }
    # and it is what the docstring prints
    doc = mt.Mesh.__doc__
    for name in ("tp", "dp", "pp"):
        for group in groups[name]:
            assert str(group) in doc


def test_layout_8_rank_doctest():
    assert mt.layout(dp=2, pp=2, tp=2)["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_rank_5_of_the_example_has_the_documented_neighbours():
    groups = mt.layout(dp=2, pp=4, tp=2)
    pp_group = next(g for g in groups["pp"] if 5 in g)
    stage = mt.Axis("pp", tuple(pp_group), pp_group.index(5))
    assert (stage.rank, stage.prev, stage.next) == (1, 1, 9)
    assert not stage.is_first and not stage.is_last
    tp_group = next(g for g in groups["tp"] if 5 in g)
    dp_group = next(g for g in groups["dp"] if 5 in g)
    assert (tp_group.index(5), dp_group.index(5)) == (1, 0)


@pytest.mark.parametrize("dp,pp,tp", [(1, 1, 1), (3, 1, 1), (1, 3, 1), (1, 1, 3), (2, 3, 4),
                                      (3, 2, 1), (4, 1, 2), (1, 2, 5)])
def test_layout_follows_megatron_order_for_any_sizes(dp, pp, tp):
    groups = mt.layout(dp=dp, pp=pp, tp=tp)
    world = dp * pp * tp
    for name, size in (("tp", tp), ("dp", dp), ("pp", pp)):
        assert len(groups[name]) == world // size
        assert all(len(g) == size for g in groups[name])
        assert sorted(itertools.chain.from_iterable(groups[name])) == list(range(world))
    for rank in range(world):
        for name, group in expected_groups(dp, pp, tp, rank).items():
            assert group in groups[name], (name, rank)


@pytest.mark.parametrize("kwargs", [{"tp": 0}, {"dp": -1}, {"pp": 0}, {"tp": 1.5},
                                    {"dp": True}, {"pp": "2"}])
def test_layout_refuses_non_positive_or_non_integer_sizes(kwargs):
    (name, value), = kwargs.items()
    with pytest.raises(ValueError, match=name):
        mt.layout(**kwargs)


def test_mesh_outside_a_launch_says_how_to_get_one():
    with pytest.raises(RuntimeError, match=r"mt\.launch"):
        mt.Mesh(dp=1, pp=1, tp=1)
    with pytest.raises(RuntimeError, match=r"mt\.launch"):
        mt.world()


# --------------------------------------------------------------------------- inside a run
def _axis_view(axis):
    return {
        "name": axis.name, "ranks": list(axis.ranks), "rank": axis.rank, "size": axis.size,
        "global_rank": axis.global_rank, "prev": axis.prev, "next": axis.next,
        "is_first": axis.is_first, "is_last": axis.is_last, "repr": repr(axis),
    }


def _mesh_worker(sizes_list):
    rank = dist.get_rank()
    out = []
    for sizes in sizes_list:
        mesh = mt.Mesh(**sizes)
        view = {name: _axis_view(getattr(mesh, name)) for name in ("tp", "dp", "pp")}
        view["coords"] = mesh.coords
        view["repr"] = repr(mesh)
        view["world_size"] = mesh.world_size
        before = len(mt.trace.events())
        me = torch.tensor([float(rank)], dtype=torch.float64)
        view["sums"] = {name: mt.comm.all_reduce(me, getattr(mesh, name)).item()
                        for name in ("tp", "dp", "pp")}
        view["gathered"] = {name: mt.comm.all_gather(me, getattr(mesh, name)).tolist()
                            for name in ("tp", "dp", "pp")}
        view["group_ranks"] = [list(e.group_ranks) for e in mt.trace.events()[before:]]
        out.append(view)
    errors = []
    for bad in BAD_MESHES:
        try:
            mt.Mesh(**bad)
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    return out, errors


BAD_MESHES = [
    {"dp": 3, "pp": 1, "tp": 1},  # 3 != 8
    {"dp": 2, "pp": 2, "tp": 4},  # 16 != 8
    {"dp": 8, "pp": 1, "tp": 0},  # 0
    {"dp": -2, "pp": -4, "tp": 1},  # negative, though the product is 8
    {"dp": 2, "pp": 2, "tp": 2.0},  # not an integer, though the product is 8
]


MESHES = [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 1, "pp": 4, "tp": 2}, {"dp": 2, "pp": 1, "tp": 4}]


@pytest.fixture(scope="module")
def mesh_run():
    return mt.launch(_mesh_worker, 8, MESHES, timeout=60)


@pytest.mark.parametrize("which", range(len(MESHES)), ids=lambda i: "dp{dp}-pp{pp}-tp{tp}".format(
    **MESHES[i]))
def test_axes_of_every_rank(mesh_run, which):
    sizes = MESHES[which]
    dp, pp, tp = sizes["dp"], sizes["pp"], sizes["tp"]
    for rank in range(8):
        view = mesh_run[rank][0][which]
        groups = expected_groups(dp, pp, tp, rank)
        p, d, t = coords_of(rank, dp, pp, tp)
        assert view["coords"] == {"dp": d, "pp": p, "tp": t}
        assert view["world_size"] == 8
        for name, index in (("tp", t), ("dp", d), ("pp", p)):
            axis = view[name]
            ranks = groups[name]
            assert axis["name"] == name
            assert axis["ranks"] == ranks
            assert axis["rank"] == index and axis["size"] == len(ranks)
            assert axis["global_rank"] == rank
            assert axis["prev"] == ranks[(index - 1) % len(ranks)]  # wraps around
            assert axis["next"] == ranks[(index + 1) % len(ranks)]
            assert axis["is_first"] == (index == 0)
            assert axis["is_last"] == (index == len(ranks) - 1)


def test_pipeline_neighbours_of_the_4_stage_mesh(mesh_run):
    # Mesh(dp=1, pp=4, tp=2): pipelines [0, 2, 4, 6] and [1, 3, 5, 7]
    stages = {r: mesh_run[r][0][1]["pp"] for r in range(8)}
    assert [(stages[r]["prev"], stages[r]["next"]) for r in (0, 2, 4, 6)] == [
        (6, 2), (0, 4), (2, 6), (4, 0)]
    assert [stages[r]["is_first"] for r in (0, 2, 4, 6)] == [True, False, False, False]
    assert [stages[r]["is_last"] for r in (1, 3, 5, 7)] == [False, False, False, True]


@pytest.mark.parametrize("which", range(len(MESHES)))
def test_collectives_stay_inside_their_group(mesh_run, which):
    sizes = MESHES[which]
    for rank in range(8):
        view = mesh_run[rank][0][which]
        groups = expected_groups(sizes["dp"], sizes["pp"], sizes["tp"], rank)
        assert view["sums"] == {name: float(sum(g)) for name, g in groups.items()}
        assert view["gathered"] == {name: [float(q) for q in g] for name, g in groups.items()}
        # Collectives on an axis of one rank move nothing and are not traced.
        traced = [g for g in (groups["tp"], groups["dp"], groups["pp"]) if len(g) > 1]
        assert view["group_ranks"] == traced * 2


def test_mesh_that_does_not_fill_the_world_names_the_sizes(mesh_run):
    for rank in range(8):
        first, second = mesh_run[rank][1][:2]
        assert first is not None and second is not None
        assert "dp=3" in first and "pp=1" in first and "tp=1" in first
        assert "3" in first and "8" in first
        assert "dp=2, pp=2, tp=4" in second and "16" in second and "8" in second


def test_mesh_refuses_non_positive_or_non_integer_sizes(mesh_run):
    for rank in range(8):
        zero, negative, fractional = mesh_run[rank][1][2:]
        assert zero is not None and "tp" in zero and "0" in zero
        assert negative is not None and ("dp" in negative or "pp" in negative)
        assert fractional is not None and "tp" in fractional


def test_repr_is_readable(mesh_run):
    view = mesh_run[5][0][0]  # rank 5 of Mesh(dp=2, pp=2, tp=2)
    assert view["repr"] == ("Mesh(dp=2, pp=2, tp=2) on rank 5: tp 1/2 [4, 5], "
                            "dp 0/2 [5, 7], pp stage 1/2 [1, 5]")
    assert view["tp"]["repr"] == "Axis(tp: rank 1 of 2, ranks [4, 5])"
    assert "ProcessGroup" not in view["pp"]["repr"] and "object at" not in view["pp"]["repr"]


def test_mesh_of_size_one_everywhere_in_a_world_of_one():
    def one():
        mesh = mt.Mesh()
        x = torch.arange(3.0)
        return ([mesh.tp.size, mesh.dp.size, mesh.pp.size, mesh.pp.prev, mesh.pp.next,
                 mesh.pp.is_first, mesh.pp.is_last],
                mt.comm.all_reduce(x, mesh.tp), mt.comm.all_gather(x, mesh.dp),
                mt.comm.reduce_scatter(x, mesh.pp))

    (facts, reduced, gathered, scattered), = mt.launch(one, 1, timeout=30)
    assert facts == [1, 1, 1, 0, 0, True, True]
    for t in (reduced, gathered, scattered):
        assert torch.equal(t, torch.arange(3.0))


# --------------------------------------------------------------------------- context parallelism
def coords_4d(rank: int, dp: int, pp: int, cp: int, tp: int) -> tuple[int, int, int, int]:
    """(pp, dp, cp, tp) indices from rank = ((pp_i·dp + dp_i)·cp + cp_i)·tp + tp_i."""
    return rank // (dp * cp * tp), (rank // (cp * tp)) % dp, (rank // tp) % cp, rank % tp


def expected_groups_4d(dp: int, pp: int, cp: int, tp: int, rank: int) -> dict[str, list[int]]:
    p, d, c, t = coords_4d(rank, dp, pp, cp, tp)

    def at(p, d, c, t):
        return ((p * dp + d) * cp + c) * tp + t

    return {
        "tp": [at(p, d, c, i) for i in range(tp)],
        "cp": [at(p, d, i, t) for i in range(cp)],
        "dp": [at(p, i, c, t) for i in range(dp)],
        "pp": [at(i, d, c, t) for i in range(pp)],
        "dp_cp": [at(p, i, j, t) for i in range(dp) for j in range(cp)],
    }


def test_cp_layout_is_the_16_rank_example_of_the_docstring():
    groups = mt.layout(dp=2, pp=2, tp=2, cp=2)
    assert groups == {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
        "pp": [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]],
        "cp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
        "dp_cp": [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]],
    }
    doc = " ".join(mt.Mesh.__doc__.split("context parallelism")[1:])
    for name, listed in groups.items():
        assert " ".join(str(g) for g in listed) in doc, name
    # rank 11: tp 1, cp 1, dp 0, stage 1, as the docstring says
    assert coords_4d(11, 2, 2, 2, 2) == (1, 0, 1, 1)


@pytest.mark.parametrize("dp,pp,cp,tp", [(1, 1, 2, 1), (2, 1, 3, 1), (1, 2, 2, 2), (2, 3, 2, 2),
                                         (3, 1, 4, 1)])
def test_cp_layout_follows_megatron_order_and_cp_1_changes_nothing(dp, pp, cp, tp):
    groups = mt.layout(dp=dp, pp=pp, tp=tp, cp=cp)
    world = dp * pp * cp * tp
    for rank in range(world):
        for name, group in expected_groups_4d(dp, pp, cp, tp, rank).items():
            assert group in groups[name], (name, rank)
    for name in groups:
        assert sorted(itertools.chain.from_iterable(groups[name])) == list(range(world))
    assert mt.layout(dp=dp, pp=pp, tp=tp, cp=1) == mt.layout(dp=dp, pp=pp, tp=tp)
    assert set(mt.layout(dp=dp, pp=pp, tp=tp)) == {"tp", "dp", "pp"}


def test_cp_layout_refuses_bad_sizes():
    with pytest.raises(ValueError, match="cp"):
        mt.layout(cp=0)


def _cp_mesh_worker():
    out = []
    for sizes in ({"dp": 2, "cp": 2, "tp": 2}, {"pp": 2, "cp": 4}, {"dp": 2, "pp": 2, "tp": 2}):
        mesh = mt.Mesh(**sizes)
        me = torch.tensor([float(dist.get_rank())], dtype=torch.float64)
        before = len(mt.trace.events())
        view = {name: (list(getattr(mesh, name).ranks), getattr(mesh, name).rank,
                       mt.comm.all_reduce(me, getattr(mesh, name)).item())
                for name in ("tp", "cp", "dp", "pp", "dp_cp")}
        view["ring"] = (mesh.cp.prev, mesh.cp.next)
        view["traced"] = [list(e.group_ranks) for e in mt.trace.events()[before:]]
        view["coords"], view["repr"] = mesh.coords, repr(mesh)
        view["dp_cp is dp"] = mesh.dp_cp is mesh.dp
        out.append(view)
    try:
        mt.Mesh(dp=2, cp=2)
        out.append(None)
    except ValueError as exc:
        out.append(str(exc))
    return out


def test_cp_axes_of_every_rank_and_collectives_inside_their_groups():
    run = mt.launch(_cp_mesh_worker, 8, timeout=60)
    for which, (dp, pp, cp, tp) in enumerate([(2, 1, 2, 2), (1, 2, 4, 1), (2, 2, 1, 2)]):
        for rank in range(8):
            view = run[rank][which]
            groups = expected_groups_4d(dp, pp, cp, tp, rank)
            p, d, c, t = coords_4d(rank, dp, pp, cp, tp)
            for name, ranks in groups.items():
                if name == "cp" and cp == 1:
                    ranks = [rank]  # an axis of one rank: talks to nobody
                assert view[name][:2] == (ranks, ranks.index(rank)), (which, rank, name)
                assert view[name][2] == float(sum(ranks)), (which, rank, name)
            ring = groups["cp"]
            assert view["ring"] == ((ring[(c - 1) % cp], ring[(c + 1) % cp]) if cp > 1
                                    else (rank, rank))
            assert view["dp_cp is dp"] == (cp == 1)
            expected = {"dp": d, "pp": p, "tp": t} | ({"cp": c} if cp > 1 else {})
            assert view["coords"] == expected
            traced = [g for name, g in groups.items() if len(g) > 1 and not (
                cp == 1 and name == "cp")]
            assert view["traced"] == traced, (which, rank)
    assert run[3][0]["repr"] == ("Mesh(dp=2, pp=1, cp=2, tp=2) on rank 3: tp 1/2 [2, 3], "
                                 "cp 1/2 [1, 3], dp 0/2 [3, 7], pp stage 0/1 [3]")
    assert "cp=" not in run[3][2]["repr"]
    assert "dp*pp*cp*tp = 4" in run[0][3] and "cp=2" in run[0][3]
