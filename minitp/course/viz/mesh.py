"""The 3D rank grid: which ranks share a tensor-, pipeline- or data-parallel group."""

from __future__ import annotations

from matplotlib.patches import Rectangle

from ...runtime.mesh import layout
from ._style import _DARK, OKABE_ITO, _new_figure

_PANELS = (("tp", "tensor-parallel groups"), ("pp", "pipeline groups"),
           ("dp", "data-parallel groups"))


def mesh_3d(dp: int = 1, pp: int = 1, tp: int = 1, *, title: str | None = None):
    """The ranks of a (dp, pp, tp) mesh drawn as a grid, three times over.

    Rows are pipeline stages (stage 0 on top); the columns are the dp replicas,
    side by side, each `tp` shards wide, so rank = stage·dp·tp + replica·tp + shard
    (Megatron's order, `mt.layout`). In each panel one dimension's groups are
    coloured, one colour per group, and every cell names its rank and its group
    ("g0", "g1", …), so the text carries what the colour does. Each cell is a
    Rectangle with ``gid="rank{r}"``. Returns the Figure.
    """
    groups = layout(dp, pp, tp)  # checks the sizes
    cols = dp * tp
    fig = _new_figure((min(15.0, 1.2 + 3 * (0.55 * cols + 0.4)), 0.9 + 0.55 * pp))
    axes = fig.subplots(1, 3)
    for ax, (dim, name) in zip(axes, _PANELS, strict=True):
        group_of = {r: g for g, ranks in enumerate(groups[dim]) for r in ranks}
        for stage in range(pp):
            for col in range(cols):
                rank = stage * cols + col
                g = group_of[rank]
                color = OKABE_ITO[g % len(OKABE_ITO)]
                ax.add_patch(Rectangle((col + 0.04, stage + 0.04), 0.92, 0.92, facecolor=color,
                                       edgecolor="black", linewidth=0.6, gid=f"rank{rank}"))
                ax.text(col + 0.5, stage + 0.5, f"{rank}\ng{g}", ha="center", va="center",
                        fontsize=8, color="white" if color in _DARK else "black")
        for d in range(1, dp):  # the replicas' borders
            ax.axvline(d * tp, color="black", linewidth=2)
        ax.set_xlim(0, cols)
        ax.set_ylim(pp, 0)
        ax.set_aspect("equal")
        ax.set_xticks([d * tp + tp / 2 for d in range(dp)], [f"dp {d}" for d in range(dp)])
        ax.set_yticks([s + 0.5 for s in range(pp)], [f"stage {s}" for s in range(pp)])
        ax.tick_params(length=0)
        ax.set_title(f"{name}: {len(groups[dim])} of {len(groups[dim][0])} ranks", fontsize=9)
    fig.suptitle(title or f"(dp, pp, tp) = ({dp}, {pp}, {tp}): {dp * pp * tp} ranks; "
                 f"each replica is {tp} tensor shards wide", fontsize=10)
    return fig
