"""Lesson 17: memory per GPU and step time as stacked bars; a plan's candidates."""

from __future__ import annotations

import matplotlib
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ._style import COMPUTE_COLOR, OKABE_ITO, _new_figure, human_seconds, rank_color

# (lesson 17) what a configuration costs, from minitp.calc: memory by kind, time by part.
MEMORY_COLORS = {"parameters": "#0072B2", "gradients": "#56B4E9", "optimizer": "#E69F00",
                 "activations": "#009E73"}
TIME_COLORS = {"compute": COMPUTE_COLOR, "tp": "#D55E00", "pp": "#009E73", "dp": "#CC79A7",
               "bubble": "#F0E442"}
_GIB = 2**30


def _stacked(ax, table, colors, scale, gid):
    """One stacked bar per setting of `table` ({setting: {part: value}}; "total" skipped),
    and a legend of the parts; returns [(x, bar height)]."""
    used, tops = {}, []
    for i, (name, parts) in enumerate(table.items()):
        bottom = 0.0
        for part, value in parts.items():
            if part == "total":
                continue
            color = colors.get(part, OKABE_ITO[len(used) % len(OKABE_ITO)])
            used.setdefault(part, color)
            ax.bar(i, value / scale, 0.6, bottom=bottom, color=color, edgecolor="white",
                   linewidth=0.6, gid=f"{gid}-{name}-{part}")
            bottom += value / scale
        tops.append((i, bottom))
    ax.legend(handles=[Patch(facecolor=c, edgecolor="white", label=p) for p, c in used.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(len(used), 5),
              fontsize=8, frameon=False)
    return tops


def memory_and_time(memory, time, *, capacity=None, limit=None, title: str | None = None,
                    width: float = 10.0):
    """Two panels of stacked bars, one bar per setting: memory per GPU by kind (GiB) and
    step time by part (seconds).

    memory: {setting: {kind: bytes}} (as `minitp.calc.memory_per_gpu`); time:
    {setting: {part: seconds}} (as `StepTime.as_dict()`); a "total" key is skipped and
    each bar's total written above it. capacity: the GPU's memory in bytes (a solid
    line), limit: what a run may fill (dashed). Returns the Figure.
    """
    if not memory or list(memory) != list(time):
        raise ValueError("memory and time need the same settings, in the same order")
    fig = _new_figure((width, 4.2 + 0.15 * max(len(str(n).splitlines()) for n in memory)))
    ax_mem, ax_time = fig.subplots(1, 2)
    names = list(memory)
    top = 0.0
    for i, total in _stacked(ax_mem, memory, MEMORY_COLORS, _GIB, "memory"):
        ax_mem.text(i, total, f"{total:.1f}", ha="center", va="bottom", fontsize=8)
        top = max(top, total)
    for value, style, text in ((capacity, "-", "GPU memory"), (limit, "--", "usable")):
        if value is not None:
            ax_mem.axhline(value / _GIB, color="#D55E00", linestyle=style, linewidth=1.0,
                           gid=f"line-{text}")
            ax_mem.text(len(names) - 0.45, value / _GIB, f"{text} {value / _GIB:.0f}",
                        ha="right", va="bottom", fontsize=7, color="#D55E00")
            top = max(top, value / _GIB)
    ax_mem.set_ylim(0, top * 1.12 or 1)
    ax_mem.set_ylabel("GiB on the busiest GPU")
    ax_mem.set_title("Memory per GPU, by kind", fontsize=10, loc="left")
    top = 0.0
    for i, total in _stacked(ax_time, time, TIME_COLORS, 1.0, "time"):
        ax_time.text(i, total, human_seconds(total), ha="center", va="bottom", fontsize=8)
        top = max(top, total)
    ax_time.set_ylim(0, top * 1.12 or 1)
    ax_time.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human_seconds(v) if v else "0"))
    ax_time.set_ylabel("seconds per iteration (predicted)")
    ax_time.set_title("Step time, by part", fontsize=10, loc="left")
    for ax in (ax_mem, ax_time):
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    return fig


def plan_candidates(plan, *, highlight=None, title: str | None = None):
    """Every configuration a `minitp.calc.plan` found to fit: memory on the busiest GPU
    against predicted step time, colour by tp, marker by recomputation, the best starred.

    highlight: {label: Candidate} to circle and name (e.g. a published configuration).
    Returns the Figure.
    """
    if not plan.candidates:
        raise ValueError("plan_candidates: no configuration fits, nothing to draw")
    fig = _new_figure((8.0, 4.8))
    ax = fig.add_subplot()
    tps = sorted({c.tp for c in plan.candidates})
    markers = {None: "o", "selective": "s", "full": "^"}
    for tp in tps:
        for recompute, marker in markers.items():
            group = [c for c in plan.candidates if c.tp == tp and c.recompute == recompute]
            if group:
                ax.scatter([c.memory["total"] / _GIB for c in group],
                           [c.time.total for c in group], s=22, marker=marker,
                           color=rank_color(tps.index(tp)), alpha=0.75, linewidth=0,
                           gid=f"tp{tp}-{recompute}")
    best = plan.best
    ax.scatter([best.memory["total"] / _GIB], [best.time.total], s=260, marker="*",
               facecolor="none", edgecolor="black", linewidth=1.2, gid="best", zorder=4)
    ax.annotate(f"best: dp={best.dp} pp={best.pp} tp={best.tp}",
                (best.memory["total"] / _GIB, best.time.total), xytext=(-12, -4),
                textcoords="offset points", fontsize=8, ha="right", va="top")
    for label, c in (highlight or {}).items():
        ax.scatter([c.memory["total"] / _GIB], [c.time.total], s=160, facecolor="none",
                   edgecolor="#D55E00", linewidth=1.4, gid=f"highlight-{label}", zorder=4)
        ax.annotate(label, (c.memory["total"] / _GIB, c.time.total), xytext=(-12, 8),
                    textcoords="offset points", fontsize=8, color="#D55E00", ha="right")
    ax.set_yscale("log")
    seconds = [c.time.total for c in plan.candidates]
    ax.set_ylim(min(seconds) / 1.25, max(seconds) * 1.25)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human_seconds(v)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("GiB on the busiest GPU")
    ax.set_ylabel("predicted seconds per iteration (log)")
    ax.grid(color="#DDDDDD", linewidth=0.6)
    handles = [Patch(color=rank_color(k), label=f"tp={tp}") for k, tp in enumerate(tps)]
    handles += [matplotlib.lines.Line2D([], [], marker=m, linestyle="", color="#777777",
                                        label=f"recompute {r or 'none'}")
                for r, m in markers.items()]
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or f"{len(plan.candidates)} configurations that fit, of "
                 f"{plan.tried} tried", fontsize=11, loc="left")
    return fig


