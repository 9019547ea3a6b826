"""Lesson 16: the step split into compute / waiting / transfer; efficiency and speed-up curves."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from ._style import COMPUTE_COLOR, OKABE_ITO, _new_figure, human_seconds

SPLIT_COLORS = {
    "compute": COMPUTE_COLOR,
    "waiting": "#E69F00",  # inside a collective, before the last rank arrived
    "transfer": "#0072B2",  # inside a collective, moving and adding the bytes
    "communication": "#0072B2",
}


def _time_ticks(axis) -> None:
    axis.set_major_formatter(FuncFormatter(lambda v, _: human_seconds(v) if v else "0"))


def step_split(panels, *, title: str | None = None, width: float = 10.0):
    """Step time split into its parts: one stacked bar per run, one panel per experiment.

    panels: {panel title: {bar label: {part: seconds}}}, for example
        {"weak scaling": {"t=1": {"compute": 0.06, "waiting": 0.0, "transfer": 0.001}, ...}}.
    Parts stack bottom-up in the order given ("compute" grey, "waiting" orange,
    "transfer" or "communication" blue, others from the palette). Every part but
    "compute" is communication: its share of the bar is written above the bar, and
    the bar's total beside it. Each panel has its own time axis. Returns the Figure.
    """
    if not panels or not all(panels.values()):
        raise ValueError("step_split needs at least one panel, each with at least one bar")
    parts = list(dict.fromkeys(p for bars in panels.values() for b in bars.values() for p in b))
    extra = iter(c for c in OKABE_ITO if c not in SPLIT_COLORS.values())
    color_of = {p: SPLIT_COLORS.get(p) or next(extra) for p in parts}
    fig = _new_figure((width, 3.9))
    axes = fig.subplots(1, len(panels), squeeze=False,
                        gridspec_kw={"width_ratios": [max(2, len(b)) for b in panels.values()]})[0]
    for ax, (panel, bars) in zip(axes, panels.items(), strict=True):
        top = max(sum(b.values()) for b in bars.values()) or 1.0
        for i, (label, split) in enumerate(bars.items()):
            bottom = 0.0
            for part, seconds in split.items():
                if seconds < 0:
                    raise ValueError(f"{panel} / {label}: {part} is negative ({seconds})")
                ax.bar(i, seconds, 0.62, bottom=bottom, color=color_of[part],
                       edgecolor="white", linewidth=0.6, gid=f"part-{panel}-{label}-{part}")
                bottom += seconds
            comm = sum(v for p, v in split.items() if p != "compute")
            share = comm / bottom if bottom else 0.0
            ax.text(i, bottom + 0.02 * top, f"{human_seconds(bottom)}\n{share:.0%} comm.",
                    ha="center", va="bottom", fontsize=8, gid=f"share-{panel}-{label}")
        ax.set_xticks(range(len(bars)), list(bars))
        ax.set_xlim(-0.6, len(bars) - 0.4)
        ax.set_ylim(0, top * 1.25)
        _time_ticks(ax.yaxis)
        ax.set_title(panel, fontsize=10, loc="left")
        ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].set_ylabel("time per training step")
    handles = [Patch(facecolor=color_of[p], edgecolor="white", label=p) for p in parts]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(parts), fontsize=8,
               frameon=False)
    fig.suptitle(title or "Where a training step's time goes", fontsize=11, x=0.01, ha="left")
    return fig


def _log2_t_axis(ax, ts) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tensor-parallel size t (GPUs or processes)")


def scaling_efficiency(series, *, published=None, title: str | None = None,
                       series_kind: str = "predicted", published_kind: str = "published"):
    """Scaling efficiency against the tensor-parallel size t.

    series: {name: {t: efficiency}} (fractions, 1.0 = perfect), drawn as lines with
        small markers: predictions, or this machine's measurements (``series_kind``
        says which, in the legend).
    published: {name: {t: efficiency}}, drawn as large hollow markers, each labelled
        with its value: the numbers a paper printed. A name in both dicts gets one
        colour, so a prediction and the number it is set beside pair up.
    Returns the Figure.
    """
    published = published or {}
    if not series and not published:
        raise ValueError("scaling_efficiency needs at least one series")
    names = list(dict.fromkeys([*series, *published]))
    color_of = {name: OKABE_ITO[k % len(OKABE_ITO)] for k, name in enumerate(names)}
    ts = sorted({t for values in [*series.values(), *published.values()] for t in values})
    fig = _new_figure((7.8, 4.6))
    ax = fig.add_subplot()
    ax.axhline(100, color="#999999", linewidth=0.8, linestyle=":")
    for name, values in series.items():
        xs = sorted(values)
        ax.plot(xs, [100 * values[t] for t in xs], "-o", color=color_of[name], linewidth=1.6,
                markersize=4, label=f"{name}: {series_kind}", gid=f"series-{name}")
    for k, (name, values) in enumerate(published.items()):
        xs = sorted(values)
        ax.plot(xs, [100 * values[t] for t in xs], linestyle="", marker="sD^v"[k % 4],
                markersize=11, markerfacecolor="none", markeredgewidth=2,
                color=color_of[name], label=f"{name}: {published_kind}",
                gid=f"published-{name}")
        for t in xs:
            ax.annotate(f"{100 * values[t]:.0f}%", (t, 100 * values[t]), xytext=(11, 0),
                        textcoords="offset points", fontsize=8, color=color_of[name],
                        va="center", gid=f"value-{name}-{t}")
    _log2_t_axis(ax, ts)
    ax.set_xlim(ts[0] / 1.15, ts[-1] * 1.3)
    low = min(100 * v for values in [*series.values(), *published.values()]
              for v in values.values())
    ax.set_ylim(max(0.0, min(50.0, low - 10)), 105)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}%"))
    ax.set_ylabel("efficiency (100% = perfect scaling)")
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "Weak-scaling efficiency: predicted and published", fontsize=11,
                 loc="left")
    return fig


def speedup(overheads=None, *, points=None, lines=None, t_max: int = 8,
            title: str | None = None):
    """Strong scaling: speedup over one worker against the number of workers t.

    overheads: {name: c} draws Amdahl's law for tensor parallelism, 1/(c + 1/t): the
        work splits over t workers and a cost c (a fraction of the one-worker time:
        communication) is added, so the speedup never passes 1/c (drawn dashed). The
        curve starts at t = 2, where there is communication at all.
    points: {name: {t: speedup}}, measured or published, as markers.
    lines: {name: {t: speedup}}, predicted, as thin dashed lines with small markers.
    A name shared by a curve and points gets one colour. The diagonal is perfect
    scaling. Returns the Figure.
    """
    overheads, points, lines = overheads or {}, points or {}, lines or {}
    names = list(dict.fromkeys([*overheads, *points, *lines]))
    if not names:
        raise ValueError("speedup needs at least one curve, point set or line")
    color_of = {name: OKABE_ITO[k % len(OKABE_ITO)] for k, name in enumerate(names)}
    ts = [2**k for k in range(int(math.log2(t_max)) + 1)]
    grid = np.geomspace(2, t_max, 200)
    fig = _new_figure((7.8, 4.6))
    ax = fig.add_subplot()
    ax.plot([1, t_max], [1, t_max], ":", color="#999999", linewidth=1.0, label="perfect: t")
    lowest = 1.0
    for name, c in overheads.items():
        if c <= 0:
            raise ValueError(f"{name}: the overhead must be positive, got {c}")
        law = 1.0 / (c + 1.0 / grid)
        lowest = min(lowest, law.min())
        ax.plot(grid, law, "-", color=color_of[name], linewidth=1.8,
                label=f"{name}: 1/(c + 1/t), c = {c:.2f}", gid=f"law-{name}")
        if 1.0 / c < t_max * 1.1:
            ax.axhline(1.0 / c, color=color_of[name], linewidth=0.8, linestyle="--",
                       gid=f"ceiling-{name}")
            ax.annotate(f"ceiling 1/c = {1.0 / c:.1f}", (1.02, 1.0 / c), xytext=(0, 3),
                        textcoords="offset points", fontsize=8, color=color_of[name],
                        gid=f"ceiling-text-{name}")
    for name, values in lines.items():
        xs = sorted(values)
        lowest = min(lowest, *values.values())
        ax.plot(xs, [values[t] for t in xs], "--.", color=color_of[name], linewidth=1.2,
                label=name, gid=f"line-{name}")
    for k, (name, values) in enumerate(points.items()):
        xs = sorted(values)
        lowest = min(lowest, *values.values())
        ax.plot(xs, [values[t] for t in xs], linestyle="", marker="oDs^"[k % 4], markersize=8,
                color=color_of[name], markeredgecolor="black", markeredgewidth=0.6,
                label=name, gid=f"points-{name}")
    _log2_t_axis(ax, ts)
    ax.set_yscale("log", base=2)
    bottom = 2.0 ** min(-1, math.floor(math.log2(lowest / 1.1)))
    yticks = [2.0**k for k in range(int(math.log2(bottom)), int(math.log2(t_max)) + 1)]
    ax.set_yticks(yticks, [f"{y:g}" for y in yticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(bottom, t_max * 1.15)
    ax.set_ylabel("speedup over t = 1")
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "Strong scaling: speedup against workers, and Amdahl's ceiling",
                 fontsize=11, loc="left")
    return fig
