"""Tensor parallelism drawn (lesson 03): one layer's dataflow with its collectives, from
a real run's trace. (Y = XA split across ranks is `minitp.course.viz.split_matmul`.)"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib
from matplotlib.patches import Patch, Rectangle

from ._style import PHASE_COLORS, PHASE_NAMES, _canvas, _tint, human_bytes, op_name, rank_color


@dataclass(frozen=True)
class _Step:
    """One item of a layer's dataflow: a box (an op), a mapping (f or g), or a junction."""

    kind: str  # "data", "op", "map", "add"
    name: str
    note: str = ""
    holds: str = "replicated"  # "replicated", "shard", "partial", or "residual" (the
    # residual stream: replicated, or a sequence shard under sequence parallelism)


_F = _Step("map", "f")
_G = _Step("map", "g")
_ATTENTION_STEPS = [
    _F,
    _Step("op", "qkv", "column-parallel\nq, k, v of its heads", "shard"),
    _Step("op", "attention", "on its\nn_head/t heads", "shard"),
    _Step("op", "proj", "row-parallel\n(no bias yet)", "partial"),
    _G,
]
_MLP_STEPS = [
    _F,
    _Step("op", "fc", "column-parallel\n4h/t features", "shard"),
    _Step("op", "GELU", "on its features", "shard"),
    _Step("op", "proj", "row-parallel\n(no bias yet)", "partial"),
    _G,
]
_DATAFLOW_ROWS = {
    "mlp": [[_Step("data", "X", "(B, T, h)", "residual"), *_MLP_STEPS,
             _Step("data", "Z", "+ bias", "residual")]],
    "attention": [[_Step("data", "X", "(B, T, h)", "residual"), *_ATTENTION_STEPS,
                   _Step("data", "out", "+ bias", "residual")]],
    "block": [
        [_Step("data", "x", "(B, T, h)", "residual"), _Step("op", "LN1", "", "residual"),
         *_ATTENTION_STEPS, _Step("add", "+")],
        [_Step("data", "x'", "x + attn", "residual"), _Step("op", "LN2", "", "residual"),
         *_MLP_STEPS, _Step("add", "+"), _Step("data", "out", "(B, T, h)", "residual")],
    ],
}
_HOLD_NAMES = {"replicated": "the same on every rank", "shard": "this rank's shard",
               "partial": "this rank's partial sum"}


def _event_matches(e, rank, label) -> bool:
    if not e.is_comm or e.rank != rank:
        return False
    return label is None or e.label == label or e.label.startswith(label + ".")


def tp_dataflow(run_or_events=None, part: str = "block", *, label: str | None = None,
                rank: int = 0, sequence_parallel: bool = False, title: str | None = None,
                unit: float = 0.42):
    """The dataflow of a tensor-parallel MLP, attention, or whole transformer layer,
    with the collectives of one layer written at the mappings f and g.

    part: "mlp" (f → fc column → GELU → proj row → g), "attention" (f → qkv column →
        attention on this rank's heads → proj row → g) or "block" (both, with the
        LayerNorms and residual adds: one layer of `mt.parallelize`).
    run_or_events: a `Run` or a list of `Event`. Its communication events of `rank`
        whose label is `label` (or starts with ``label + "."``; None takes them all)
        are placed on the mappings: forward events, in time order, on the mappings
        that communicate forward, in forward order; backward events on the mappings
        that communicate backward, in *reverse* order (backward runs the layer from
        its end). Left out, the picture says what each mapping does.
    sequence_parallel: f is an all-gather (reduce-scatter backward) and g a
        reduce-scatter (all-gather backward), so both communicate in both passes.
    Boxes are white where every rank holds the same tensor, in the rank's colour
    where it holds its own shard, hatched where it holds a partial sum.
    The title counts the collectives found; events left over (more than the
    mappings account for) are listed under the picture. Returns the Figure.
    """
    if part not in _DATAFLOW_ROWS:
        raise ValueError(f"part must be one of {sorted(_DATAFLOW_ROWS)}, got {part!r}")
    rows = _DATAFLOW_ROWS[part]
    comm_phases = {"f": ("fwd", "bwd") if sequence_parallel else ("bwd",),
                   "g": ("fwd", "bwd") if sequence_parallel else ("fwd",)}
    maps = [(i, j) for i, row in enumerate(rows) for j, s in enumerate(row) if s.kind == "map"]
    found: dict[tuple[int, int], dict[str, list]] = {m: {"fwd": [], "bwd": []} for m in maps}
    leftover: list = []
    events = None
    if run_or_events is not None:
        events = [e for e in getattr(run_or_events, "trace", run_or_events)
                  if _event_matches(e, rank, label)]
        for ph, order in (("fwd", maps), ("bwd", maps[::-1])):
            slots = [m for m in order if ph in comm_phases[rows[m[0]][m[1]].name]]
            evs = sorted((e for e in events if e.phase == ph), key=lambda e: e.start)
            for slot, e in zip(slots, evs, strict=False):
                found[slot][ph].append(e)
            leftover += evs[len(slots):]
        leftover += [e for e in events if e.phase not in ("fwd", "bwd")]

    box_w, box_h, circle_r, gap, add_r = 2.4, 1.35, 0.42, 0.55, 0.3

    def step_w(s):
        return {"map": 2 * circle_r, "add": 2 * add_r}.get(s.kind, box_w)

    row_w = [sum(step_w(s) for s in row) + gap * (len(row) - 1) for row in rows]
    width = max(row_w) + 1.2
    row_h = 4.6
    y_rows = [2.35 + i * row_h for i in range(len(rows))]
    y_legend = y_rows[-1] + box_h / 2 + 1.35
    legend_h = 0.6 if max(row_w) + 1.2 > 20 else 1.0
    n_left = min(len(leftover), 3) + (len(leftover) > 3) + 1 if leftover else 0
    height = y_legend + legend_h + 0.1 + 0.36 * n_left
    fig, ax = _canvas(width, height, unit, left=0.6)
    shard_face = _tint(rank_color(rank))
    faces = {"replicated": "white", "shard": shard_face, "partial": shard_face}
    arrow = dict(arrowstyle="-|>", color="#444444", linewidth=1.1, mutation_scale=10,
                 shrinkA=0, shrinkB=0)
    line = dict(color="#444444", linewidth=1.1)
    residual_grey = "#777777"
    sp_holds = "shard" if sequence_parallel else "replicated"  # the residual stream and LN

    def box(x, y, holds, gid):
        """A box's face (white stripes on a partial sum) and its border (which has the gid)."""
        ax.add_patch(Rectangle((x, y - box_h / 2), box_w, box_h, facecolor=faces[holds],
                               edgecolor="white", linewidth=0,
                               hatch="///" if holds == "partial" else None))
        ax.add_patch(Rectangle((x, y - box_h / 2), box_w, box_h, fill=False,
                               edgecolor="#444444", linewidth=0.9, gid=gid))

    ends = []  # per row: (x of the first item's left edge, x of its add junction)
    for i, (row, y) in enumerate(zip(rows, y_rows, strict=True)):
        x, first_x, add_x, prev_right = 0.0, 0.0, None, None
        for j, s in enumerate(row):
            w = step_w(s)
            cx = x + w / 2
            gid = f"step-{i}-{j}"
            if prev_right is not None:
                ax.annotate("", xy=(x, y), xytext=(prev_right, y), arrowprops=arrow)
            if s.kind in ("data", "op"):
                holds = sp_holds if s.holds == "residual" else s.holds
                box(x, y, holds, gid)
                ax.text(cx, y - 0.22 if s.note else y, s.name, ha="center", va="center",
                        fontsize=9.5, weight="bold", gid=gid + "-name")
                if s.note:
                    ax.text(cx, y + 0.3, s.note, ha="center", va="center", fontsize=6.8,
                            linespacing=1.05, color="#222222")
            elif s.kind == "map":
                ax.add_patch(matplotlib.patches.Circle((cx, y), circle_r, facecolor="#FFF4D6",
                                                       edgecolor="#444444", linewidth=1.1,
                                                       gid=gid))
                ax.text(cx, y, f"${s.name}$", ha="center", va="center", fontsize=12,
                        gid=gid + "-name")
                for k, ph in enumerate(("fwd", "bwd")):
                    evs = found[(i, j)][ph] if events is not None else None
                    ax.text(cx, y + box_h / 2 + 0.35 + 0.42 * k,
                            _mapping_text(s.name, ph, evs, sequence_parallel),
                            ha="center", va="top", fontsize=7.2, color=PHASE_COLORS[ph],
                            gid=f"comm-{i}-{s.name}-{ph}")
            else:  # a residual add
                ax.add_patch(matplotlib.patches.Circle((cx, y), add_r, facecolor="white",
                                                       edgecolor="#444444", linewidth=1.1,
                                                       gid=gid))
                ax.text(cx, y, "+", ha="center", va="center", fontsize=11)
                add_x = cx
            prev_right = x + w
            x += w + gap
        ends.append((first_x, add_x))
        if add_x is not None:  # the residual: from the row's input, over the top, to the add
            x_in = first_x + box_w / 2
            y_up = y - box_h / 2 - 0.55
            ax.plot([x_in, x_in, add_x], [y - box_h / 2, y_up, y_up], color=residual_grey,
                    linewidth=1.0)
            ax.annotate("", xy=(add_x, y - add_r), xytext=(add_x, y_up),
                        arrowprops={**arrow, "color": residual_grey})
            ax.text((x_in + add_x) / 2, y_up - 0.08, "residual", ha="center", va="bottom",
                    fontsize=7, color=residual_grey)
    if len(rows) == 2:  # the first row's sum is the second row's input: around, not across
        (_, add_x), (first2, _) = ends
        y1, y2 = y_rows
        x_out, x_back = add_x + 1.1, first2 - 0.35
        y_mid = y1 + box_h / 2 + 2.0
        ax.plot([add_x + add_r, x_out, x_out, x_back, x_back], [y1, y1, y_mid, y_mid, y2],
                **line)
        ax.annotate("", xy=(first2, y2), xytext=(x_back, y2), arrowprops=arrow)

    if title is None:
        what = {"mlp": "The tensor-parallel MLP", "attention": "Tensor-parallel attention",
                "block": "One tensor-parallel transformer layer"}[part]
        if events is None:
            title = f"{what}: where the conjugate mappings f and g sit"
        else:
            who = f"{label}, rank {rank}" if label else f"rank {rank}"
            title = (f"{what} ({who}): {_count_text(found, 'fwd')} forward, "
                     f"{_count_text(found, 'bwd')} backward, from the trace")
    ax.text(-0.4, 0.5, title, ha="left", va="center", fontsize=11)
    handles, labels = [], []
    for h in ("replicated", "shard", "partial"):
        face = Patch(facecolor=faces[h], edgecolor="white", linewidth=0,
                     hatch="///" if h == "partial" else None)
        handles.append((face, Patch(fill=False, edgecolor="#444444", linewidth=0.9)))
        labels.append(_HOLD_NAMES[h])
    for ph in ("fwd", "bwd"):
        handles.append(Patch(facecolor=PHASE_COLORS[ph], edgecolor="none"))
        labels.append(f"{PHASE_NAMES[ph]} communication")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(-0.4, y_legend),
              bbox_transform=ax.transData, ncol=len(handles) if width > 20 else 3,
              fontsize=7.2, frameon=False,
              handlelength=1.3, columnspacing=1.2)
    if leftover:
        text = [f"{len(leftover)} more communication event(s) that the mappings do not "
                "account for:"]
        text += [f"  {op_name(e.op)} ({PHASE_NAMES.get(e.phase, e.phase)}, label "
                 f"{e.label or '-'!r})" for e in leftover[:3]]
        if len(leftover) > 3:
            text.append(f"  … and {len(leftover) - 3} more")
        ax.text(-0.4, y_legend + legend_h, "\n".join(text), ha="left", va="top", fontsize=7.5,
                color="#B00000", gid="leftover")
    return fig


def _mapping_text(name, ph, evs, sequence_parallel) -> str:
    """What mapping `name` did in phase `ph`: from the trace (evs), or what it should do."""
    where = "fwd" if ph == "fwd" else "bwd"
    if evs is None:
        if sequence_parallel:
            op = {("f", "fwd"): "all-gather", ("f", "bwd"): "reduce-scatter",
                  ("g", "fwd"): "reduce-scatter", ("g", "bwd"): "all-gather"}[(name, ph)]
        else:
            op = "all-reduce" if (name, ph) in (("f", "bwd"), ("g", "fwd")) else "identity"
        return f"{where}: {op}"
    if not evs:
        return f"{where}: nothing"
    return f"{where}: " + ", ".join(f"{op_name(e.op)} {human_bytes(e.nbytes)}" for e in evs)


def _count_text(found, ph) -> str:
    ops: dict[str, int] = {}
    for v in found.values():
        for e in v[ph]:
            ops[e.op] = ops.get(e.op, 0) + 1
    if not ops:
        return "no collectives"
    return ", ".join(f"{n} {op_name(op)}{'s' if n > 1 else ''}" for op, n in ops.items())
