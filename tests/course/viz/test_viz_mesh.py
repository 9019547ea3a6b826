"""mt.viz.mesh_3d: every rank drawn once per panel, coloured by its group in mt.layout."""

import matplotlib.colors as mcolors
import pytest

import minitp as mt


def _cells(ax):
    return {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("rank")}


@pytest.mark.parametrize("dp, pp, tp", [(2, 2, 2), (1, 1, 1), (2, 4, 2), (3, 1, 2)])
def test_mesh_3d_colours_each_dimensions_groups(dp, pp, tp):
    fig = mt.viz.mesh_3d(dp, pp, tp)
    groups = mt.layout(dp, pp, tp)
    axes = fig.axes
    assert len(axes) == 3
    for ax, dim in zip(axes, ("tp", "pp", "dp"), strict=True):
        cells = _cells(ax)
        assert sorted(cells) == sorted(f"rank{r}" for r in range(dp * pp * tp))
        for ranks in groups[dim]:  # one colour per group
            colours = {mcolors.to_hex(cells[f"rank{r}"].get_facecolor()) for r in ranks}
            assert len(colours) == 1
        texts = {t.get_text() for t in ax.texts}
        for g, ranks in enumerate(groups[dim]):
            assert all(f"{r}\ng{g}" in texts for r in ranks)


def test_mesh_3d_places_ranks_in_megatron_order():
    ax = mt.viz.mesh_3d(2, 2, 2).axes[0]
    cells = _cells(ax)
    # rank 5: stage 1, replica 0, shard 1 -> column 1, row 1
    assert cells["rank5"].get_xy() == pytest.approx((1.04, 1.04))
    assert cells["rank2"].get_xy() == pytest.approx((2.04, 0.04))


def test_mesh_3d_rejects_bad_sizes():
    with pytest.raises(ValueError):
        mt.viz.mesh_3d(0, 1, 1)
