"""A mixture of experts drawn (lesson 26).

    routing_steps(routes, text, n_experts)   # which expert each token went to, step by step
    expert_load({"none": load, ...})        # each expert's share of the assignments, per step
    dropped({"cf 1.0": dropped}, total)     # assignments the capacity dropped, per step
    all_to_all(rows, row_bytes)             # the dispatch: rows rank i sends rank j

Plain data in (tensors or nested lists of numbers), one Figure out. Experts are coloured
by the Okabe–Ito palette in order (expert 0 blue, 1 orange, …), ranks likewise; the
numbers are written on the pictures too, so nothing depends on colour alone.
"""

from __future__ import annotations

from matplotlib.patches import Patch, Rectangle

from ._style import _DARK, OKABE_ITO, _new_figure, _tint, human_bytes, rank_color


def _expert_color(e: int) -> str:
    return OKABE_ITO[e % len(OKABE_ITO)]


def _tidy(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def routing_steps(routes, text: str, n_experts: int, steps=None, *, title: str | None = None):
    """routes (S, N, k): the experts chosen for each of N tokens after each of S steps,
    best first. One row per step (`steps`: which to show, all by default), one column
    per token of `text`; a cell is cut into k bands, the first choice on top, each
    coloured by its expert and numbered. Returns the Figure."""
    routes = [[list(map(int, token)) for token in step] for step in routes]
    steps = list(range(len(routes))) if steps is None else list(steps)
    n, k = len(routes[0]), len(routes[0][0])
    fig = _new_figure((max(6.0, 0.42 * n + 1.5), 0.5 + 0.36 * len(steps) * k / 2 + 1.2))
    ax = fig.subplots()
    for row, step in enumerate(steps):
        for i, chosen in enumerate(routes[step]):
            for slot, e in enumerate(chosen):
                y = row + slot / k
                ax.add_patch(Rectangle((i, y), 1, 1 / k, facecolor=_expert_color(e),
                                       edgecolor="white", linewidth=0.8,
                                       gid=f"cell-{step}-{i}-{slot}"))
                ax.text(i + 0.5, y + 0.5 / k, str(e), ha="center", va="center", fontsize=7,
                        color="white" if _expert_color(e) in _DARK else "black")
    ax.set_xlim(0, n)
    ax.set_ylim(len(steps), 0)
    ax.set_xticks([i + 0.5 for i in range(n)], [repr(c)[1:-1] or "␣" for c in text[:n]],
                  fontfamily="monospace")
    ax.xaxis.tick_top()
    ax.set_yticks([r + 0.5 for r in range(len(steps))], [f"step {s + 1}" for s in steps])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    handles = [Patch(color=_expert_color(e), label=f"expert {e}") for e in range(n_experts)]
    fig.legend(handles=handles, loc="outside lower center", ncol=n_experts, frameon=False,
               fontsize=8)
    ax.set_title(title or f"Where each token went (top-{k}: first choice on top), step by step",
                 fontsize=10)
    return fig


def expert_load(loads: dict, *, title: str | None = None, ylim: float | None = None):
    """loads: name -> (S, E) assignments per expert after each step (one layer, or summed
    over layers). One panel per name, side by side: each expert's share of the step's
    assignments; the dashed line is the balanced share 1/E. Returns the Figure."""
    names = list(loads)
    fig = _new_figure((3.4 * len(names) + 0.6, 3.4))
    axes = fig.subplots(1, len(names), sharey=True, squeeze=False)[0]
    top = 0.0
    for ax, name in zip(axes, names, strict=True):
        load = [[float(v) for v in step] for step in loads[name]]
        n_experts = len(load[0])
        xs = list(range(1, len(load) + 1))
        for e in range(n_experts):
            share = [step[e] / sum(step) for step in load]
            top = max(top, *share)
            ax.plot(xs, share, color=_expert_color(e), linewidth=1.4, label=f"expert {e}",
                    gid=f"{name}-expert-{e}")
        ax.axhline(1 / n_experts, color="black", linestyle=(0, (4, 3)), linewidth=1,
                   gid=f"{name}-balanced")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        _tidy(ax)
    axes[0].set_ylabel("share of the step's assignments")
    axes[0].set_ylim(0, ylim or top * 1.08)
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(axes[0].lines[-1])
    labels.append("balanced (1/E)")
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False,
               fontsize=8)
    fig.suptitle(title or "Expert load over training (measured)", fontsize=11)
    return fig


def dropped(series: dict, total: int, *, title: str | None = None):
    """series: name -> (S,) assignments dropped each step; `total`: assignments per step.
    The share dropped, step by step, one line per name. Returns the Figure."""
    fig = _new_figure((7, 3.2))
    ax = fig.subplots()
    for i, (name, values) in enumerate(series.items()):
        values = [float(v) / total for v in values]
        ax.plot(range(1, len(values) + 1), values, color=OKABE_ITO[i % len(OKABE_ITO)],
                marker="o", markersize=3, linewidth=1.4, label=name, gid=f"dropped-{name}")
    ax.set(xlabel="step", ylabel="share of the assignments dropped", ylim=(0, None))
    ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:.0%}")
    ax.legend(frameon=False, fontsize=8)
    ax.set_title(title or "Tokens dropped by the capacity, per step (measured)", fontsize=10)
    _tidy(ax)
    return fig


def all_to_all(rows, row_bytes: int, *, title: str | None = None):
    """rows (n, n): the rows rank i sends rank j in one all-to-all (its own run, the
    diagonal, stays on the rank: hatched). Each cell says rows and bytes; each row's
    total to the other ranks is written at its right. Returns the Figure."""
    rows = [[int(v) for v in r] for r in rows]
    n = len(rows)
    peak = max(max(r) for r in rows) or 1
    fig = _new_figure((1.5 * n + 2.6, 1.0 * n + 1.2))
    ax = fig.subplots()
    for i in range(n):
        for j in range(n):
            fill = _tint(rank_color(j), 0.15 + 0.85 * rows[i][j] / peak)
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=fill, edgecolor="white",
                                   linewidth=2, hatch="//" if i == j else None,
                                   gid=f"cell-{i}-{j}"))
            ax.text(j + 0.5, i + 0.5, f"{rows[i][j]} rows\n{human_bytes(rows[i][j] * row_bytes)}",
                    ha="center", va="center", fontsize=8)
        out = sum(v for j, v in enumerate(rows[i]) if j != i)
        ax.text(n + 0.1, i + 0.5, f"sends {human_bytes(out * row_bytes)}", va="center",
                fontsize=8)
    ax.set_xlim(0, n + 1.3)
    ax.set_ylim(n, 0)
    ax.set_xticks([j + 0.5 for j in range(n)], [f"to rank {j}" for j in range(n)])
    ax.set_yticks([i + 0.5 for i in range(n)], [f"rank {i}" for i in range(n)])
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title or "The dispatch all-to-all: rows from each rank (row) to each rank's "
                          "experts (column); hatched: stays", fontsize=10)
    return fig
