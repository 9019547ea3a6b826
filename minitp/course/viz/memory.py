"""Lessons 04, 05 and 07: wire bytes per label, activation memory against t, dropout
masks, trade-offs."""

from __future__ import annotations

import math
from collections import defaultdict

import matplotlib
import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from ._style import OKABE_ITO, OP_COLORS, _new_figure, human_bytes, op_name, rank_color


# Bytes on the wire per part of the model, activation memory against t, dropout masks
# rank by rank, and the memory-time trade-off of recomputation.
def _label_order(label: str) -> tuple:
    """embedding, layer0, layer1, …, head, loss, then anything else (alphabetical)."""
    if label == "embedding":
        return (0, 0, label)
    if label.startswith("layer") and label[5:].isdigit():
        return (1, int(label[5:]), label)
    if label in ("head", "loss"):
        return (2, ("head", "loss").index(label), label)
    return (3, 0, label)


def _byte_ticks(axis, top: float, most: int = 6) -> None:
    """Ticks at multiples of a power of two bytes (0, 32 KiB, 64 KiB, …), at most `most`."""
    step = 2.0 ** math.ceil(math.log2(max(top, 1.0) / most))
    axis.set_major_locator(matplotlib.ticker.MultipleLocator(step))
    axis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))


def wire_bytes(runs, *, rank: int = 0, labels=None, title: str | None = None,
               width: float = 10.0, source: str = "auto"):
    """Bytes one rank sent, per part of the model (trace label), for several runs side by side.

    runs: {setting name: Run or list of Event}, e.g. {"TP": run_tp, "TP + SP": run_sp}.
    labels: which trace labels to show (default: every label with communication, in
        model order: embedding, layer0, …, head, loss, then the rest). Nested labels
        ("layer0.attn") count towards their first component.
    Each bar is one setting's bytes for one label, stacked by collective (colour) and
    pass (forward plain, backward hatched); its total is written above it.
    source: "measured" (each event's ``sent_bytes``, counted by the kernel),
        "model" (its ``model_bytes``, the ring formula) or "auto": measured where
        every event of this rank has a measurement, else the model. One figure
        never mixes the two, and its axis label says which it shows.
    Returns the Figure.
    """
    if not runs:
        raise ValueError("wire_bytes needs at least one run")
    if source not in ("auto", "measured", "model"):
        raise ValueError(f"source is 'auto', 'measured' or 'model', got {source!r}")
    chosen = [[e for e in getattr(run, "trace", run) if e.rank == rank and e.is_comm]
              for run in runs.values()]
    unmeasured = sum(e.sent_bytes is None for events in chosen for e in events)
    if source == "measured" and unmeasured:
        raise ValueError(f"wire_bytes: {unmeasured} events of rank {rank} have no measured "
                         "bytes (GPU, no /proc/self/io, or overlapping ops): use source='model'")
    measured = source == "measured" or (source == "auto" and not unmeasured)
    totals: dict[str, dict[str, dict[tuple[str, str], int]]] = {}
    for name, events in zip(runs, chosen, strict=True):
        per_label: dict[str, dict[tuple[str, str], int]] = defaultdict(lambda: defaultdict(int))
        for e in events:
            value = e.sent_bytes if measured else e.model_bytes
            if not value:
                continue
            label = (e.label or "(no label)").split(".")[0]
            per_label[label][(e.op, "bwd" if e.phase == "bwd" else "fwd")] += value
        totals[name] = per_label
    if labels is None:
        labels = sorted({lab for per in totals.values() for lab in per}, key=_label_order)
    labels = list(labels)
    if not labels:
        raise ValueError("wire_bytes: no communication on this rank in these runs")
    fig = _new_figure((width, 4.4))
    ax = fig.add_subplot()
    n = len(runs)
    bar_w = 0.8 / n
    ops_used: dict[str, str] = {}
    top = max((sum(totals[name].get(lab, {}).values()) for name in runs for lab in labels),
              default=1) or 1
    for k, name in enumerate(runs):
        for i, lab in enumerate(labels):
            x = i - 0.4 + bar_w * (k + 0.5)
            bottom = 0
            parts = totals[name].get(lab, {})
            for (op, ph) in sorted(parts, key=lambda key: (key[1] != "fwd", key[0])):
                value = parts[(op, ph)]
                color = OP_COLORS.get(op, "#999999")
                ops_used.setdefault(op_name(op), color)
                ax.bar(x, value, bar_w * 0.92, bottom=bottom, color=color, edgecolor="white",
                       linewidth=0.6, hatch="///" if ph == "bwd" else None,
                       gid=f"bar-{name}-{lab}")
                bottom += value
            ax.text(x, bottom + 0.01 * top, human_bytes(bottom) if bottom else "0", ha="center",
                    va="bottom", fontsize=7, rotation=90 if n > 2 else 0,
                    gid=f"total-{name}-{lab}")
            ax.text(x, -0.02 * top, name, ha="center", va="top", fontsize=7, rotation=0,
                    color="#333333", gid=f"setting-{name}-{lab}")
    shown = [lab.replace(" ", "\n", 1) if len(lab) > 14 else lab for lab in labels]
    ax.set_xticks(range(len(labels)), shown)
    ax.tick_params(axis="x", length=0, pad=14)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(0, top * 1.18)
    _byte_ticks(ax.yaxis, top * 1.18)
    ax.set_ylabel(f"bytes rank {rank} sent, measured (/proc/self/io)" if measured
                  else f"bytes rank {rank} sent, ring model (not measured)")
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=c, edgecolor="white", label=op) for op, c in ops_used.items()]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///",
                         label="hatched: backward"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              frameon=False)
    ax.set_title(title or ("Bytes sent (measured) per part of the model, " if measured
                           else "Bytes sent (ring model) per part of the model, ")
                 + " vs ".join(runs), fontsize=11, loc="left")
    return fig


def memory_vs_t(ts, measured, formula=None, *, title: str | None = None,
                ylabel: str = "activation bytes per layer, per rank"):
    """Measured bytes (markers) against a formula (lines) as the tensor-parallel size grows.

    ts: the sizes t (x axis, log 2). measured: {series: one value per t}; formula: the
    same keys (a subset is fine), one value per t. Series share a colour with their
    formula. Returns the Figure.
    """
    ts = list(ts)
    fig = _new_figure((7.0, 4.4))
    ax = fig.add_subplot()
    formula = formula or {}
    for k, (name, values) in enumerate(measured.items()):
        color = OKABE_ITO[k % len(OKABE_ITO)]
        if len(values) != len(ts):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(ts)} t's")
        if name in formula:
            ax.plot(ts, formula[name], "--", color=color, linewidth=1.4,
                    label=f"{name}: formula", gid=f"formula-{name}")
        ax.plot(ts, values, "o", color=color, markersize=7, label=f"{name}: measured",
                gid=f"measured-{name}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tensor-parallel size t")
    top = max(max(v) for v in [*measured.values(), *formula.values()])
    ax.set_ylim(0, top * 1.08)
    _byte_ticks(ax.yaxis, top * 1.08)
    ax.set_ylabel(ylabel)
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(title or "Activation memory as t grows: measured against the formula",
                 fontsize=11, loc="left")
    return fig


def masks(panels, *, title: str | None = None, cell: float = 0.1):
    """Dropout masks (or any boolean grids) rank by rank: one column per panel, one row per rank.

    panels: {panel title: one 2-D boolean array per rank} (True = kept). Each mask is
    drawn in its rank's colour on white (dropped); every panel says whether the ranks'
    masks are identical or all different. Returns the Figure.
    """
    if not panels:
        raise ValueError("masks needs at least one panel")
    grids = {name: [np.asarray(m.detach().cpu() if hasattr(m, "detach") else m, dtype=bool)
                    for m in per_rank] for name, per_rank in panels.items()}
    n_ranks = max(len(g) for g in grids.values())
    widths = [max(g.shape[1] for g in per_rank) for per_rank in grids.values()]
    height = max(g.shape[0] for per_rank in grids.values() for g in per_rank)
    fig_w = max(6.0, cell * sum(widths) + 0.5 * len(grids) + 1.0)
    fig_h = cell * height * n_ranks + 0.6 * n_ranks + 1.4
    fig = _new_figure((fig_w, fig_h))
    axes = fig.subplots(n_ranks, len(grids), squeeze=False,
                        gridspec_kw={"width_ratios": widths})
    for j, (name, per_rank) in enumerate(grids.items()):
        same = all(np.array_equal(per_rank[0], g) for g in per_rank[1:])
        verdict = "the same on every rank" if same else "different on every rank"
        for r in range(n_ranks):
            ax = axes[r][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if r >= len(per_rank):
                ax.axis("off")
                continue
            cmap = matplotlib.colors.ListedColormap(["white", rank_color(r)])
            ax.imshow(per_rank[r], cmap=cmap, vmin=0, vmax=1, interpolation="nearest",
                      aspect="equal", gid=f"mask-{name}-rank{r}")
            if j == 0:
                ax.set_ylabel(f"rank {r}", fontsize=9)
            if r == 0:
                ax.set_title(f"{name}\n({verdict})", fontsize=9)
    fig.suptitle(title or "Dropout masks, rank by rank (colour: kept, white: dropped)",
                 fontsize=11, x=0.01, ha="left")
    return fig


def tradeoff(points, *, title: str | None = None, baseline: str | None = None):
    """Memory against time for several settings, one marker shape per series.

    points: {series: {setting: (memory, time)}}, each relative to a baseline setting
    (1.0, 1.0), e.g. {"this run": {...}, "Korthikanti et al., 22B": {...}}. A setting
    has one colour in every series (named once, beside its point of the first series
    that has it), and its points are joined by a thin line.
    baseline: the setting both axes are relative to (named in the axis labels).
    Returns the Figure.
    """
    if not points:
        raise ValueError("tradeoff needs at least one series")
    settings = list(dict.fromkeys(s for series in points.values() for s in series))
    color_of = {s: OKABE_ITO[k % len(OKABE_ITO)] for k, s in enumerate(settings)}
    markers = ["o", "s", "^", "D"]
    fig = _new_figure((7.8, 4.8))
    ax = fig.add_subplot()
    for setting in settings:
        xy = [series[setting] for series in points.values() if setting in series]
        if len(xy) > 1:
            ax.plot([p[0] for p in xy], [p[1] for p in xy], "-", color=color_of[setting],
                    linewidth=0.8, alpha=0.5, zorder=1)
    named = set()
    for k, (series, values) in enumerate(points.items()):
        for setting, (mem, time_) in values.items():
            ax.scatter([mem], [time_], s=70, marker=markers[k % len(markers)],
                       color=color_of[setting], edgecolor="black" if k else "white",
                       linewidth=0.7, zorder=3, gid=f"point-{series}-{setting}")
            if setting not in named:
                named.add(setting)
                ax.annotate(setting, (mem, time_), xytext=(7, -3), textcoords="offset points",
                            fontsize=8, color=color_of[setting], weight="bold", zorder=4,
                            bbox=dict(boxstyle="round,pad=0.15", facecolor="white",
                                      edgecolor="none", alpha=0.8), gid=f"text-{setting}")
    handles = [matplotlib.lines.Line2D([], [], marker=markers[k % len(markers)], linestyle="",
                                       color="#777777", markersize=8, label=series)
               for k, series in enumerate(points)]
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper center",
              bbox_to_anchor=(0.5, -0.13), ncol=1)
    rel = f" (× {baseline})" if baseline else " (relative)"
    ax.set_xlabel("activation memory per layer" + rel)
    ax.set_ylabel("time" + rel)
    ax.set_xlim(left=0)
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.set_title(title or "Memory against time: what each setting costs", fontsize=11,
                 loc="left")
    return fig




def tradeoff_panels(panels, *, title: str | None = None):
    """Memory against time, one panel per source, so that numbers of different kinds
    (a paper's GPU times, FLOPs counted here, CPU times measured here) never share an axis.

    panels: {panel title: {"points": {setting: (memory, time)}, "x": x label, "y": y label}},
    each panel's points relative to its own baseline. A setting has one colour and one
    marker in every panel, named once in a legend below them all (labels beside the
    points would overlap where settings cost alike). Returns the Figure.
    """
    if not panels or not all(p.get("points") for p in panels.values()):
        raise ValueError("tradeoff_panels needs at least one panel, each with points")
    settings = list(dict.fromkeys(s for p in panels.values() for s in p["points"]))
    color_of = {s: OKABE_ITO[k % len(OKABE_ITO)] for k, s in enumerate(settings)}
    marker_of = {s: "osD^vP"[k % 6] for k, s in enumerate(settings)}
    fig = _new_figure((4.0 * len(panels) + 0.6, 4.8))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, panel) in zip(axes, panels.items(), strict=True):
        for setting, (mem, time_) in panel["points"].items():
            ax.scatter([mem], [time_], s=70, marker=marker_of[setting], color=color_of[setting],
                       edgecolor="black", linewidth=0.6, zorder=3, gid=f"point-{name}-{setting}")
        ax.set_xlabel(panel.get("x", "memory (relative)"), fontsize=9)
        ax.set_ylabel(panel.get("y", "time (relative)"), fontsize=9)
        ax.set_xlim(0, 1.1 * max(m for m, _ in panel["points"].values()))
        ax.grid(color="#DDDDDD", linewidth=0.6)
        ax.set_title(name, fontsize=9.5, loc="left")
    handles = [matplotlib.lines.Line2D([], [], marker=marker_of[s], linestyle="",
                                       color=color_of[s], markeredgecolor="black",
                                       markersize=8, label=s) for s in settings]
    # "outside": the layout engine makes room for it below the axis labels, never over them
    fig.legend(handles=handles, fontsize=9, frameon=False, loc="outside lower center",
               ncol=len(settings))
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    return fig
