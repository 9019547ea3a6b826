"""A run's trace as per-rank swimlanes over time."""

from __future__ import annotations

import math
from collections import defaultdict

from matplotlib.patches import Patch, Rectangle

from ._style import (
    _DARK,
    COMPUTE_COLOR,
    OP_COLORS,
    PHASE_COLORS,
    PHASE_NAMES,
    _new_figure,
    human_bytes,
    op_name,
)


def timeline(run_or_events, ax=None, *, color_by: str = "auto", title: str | None = None,
             show_bytes: bool = True, width: float = 10.0):
    """Every rank's events over time: one swimlane per rank, one bar per event.

    run_or_events: a `Run` (its ``.trace`` is drawn, and every rank gets a lane
        even if it recorded nothing) or a list of `Event`.
    color_by: "phase" (forward / backward / neither; compute in grey), "op" (one
        colour per kind of collective), or "auto": by phase when the trace has any
        backward event (a training step), else by op. (Outside a backward pass every
        collective counts as "fwd", so colouring a plain run by phase says nothing.)
    Events that overlap on one rank (a `sendrecv` records a send and a receive
    that run at once) are stacked in sub-lanes. Each bar is labelled with its op,
    and its size when ``show_bytes`` and the label fits; a label that does not
    fit inside goes beside the bar if there is room, else it is left out.
    Time is in milliseconds from the first event. Returns the Figure.
    """
    if color_by not in ("auto", "phase", "op"):
        raise ValueError(f"color_by must be 'auto', 'phase' or 'op', got {color_by!r}")
    events = list(getattr(run_or_events, "trace", run_or_events))
    if color_by == "auto":
        color_by = "phase" if any(e.phase == "bwd" for e in events) else "op"
    world = getattr(run_or_events, "world_size", None)
    ranks = list(range(world)) if world else sorted({e.rank for e in events})
    if not ranks:
        raise ValueError("timeline: there are no events and no ranks to draw")
    row_of = {rank: i for i, rank in enumerate(ranks)}

    if ax is None:
        fig = _new_figure((width, 0.9 + 0.55 * len(ranks)))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    t0 = min((e.start for e in events), default=0.0)
    t1 = max((e.end for e in events), default=t0 + 1e-3)
    span_ms = max((t1 - t0) * 1e3, 1e-3)
    pad = 0.02 * span_ms
    ax.set_xlim(-pad, span_ms + pad)
    ax.set_ylim(len(ranks) - 0.5, -0.5)  # rank 0 at the top
    min_width = 0.004 * span_ms  # so an event of a few microseconds is still a visible sliver

    # Pixels per millisecond, to decide which labels fit (the layout may shift this a little).
    fig_w_px = fig.get_figwidth() * fig.dpi
    px_per_ms = ax.get_position().width * fig_w_px / (span_ms + 2 * pad)
    fontsize = 8.0
    char_px = 0.6 * fontsize * fig.dpi / 72.0

    by_rank: dict[int, list] = defaultdict(list)
    for e in events:
        by_rank[e.rank].append(e)
    used: dict[str, str] = {}  # legend entry -> colour, in order of first use
    for rank, evs in by_rank.items():
        if rank not in row_of:
            continue
        lanes = _assign_lanes(evs)
        n_lanes = max(lanes) + 1
        lane_h = 0.8 / n_lanes
        lane_px = lane_h * ax.get_position().height * fig.get_figheight() * fig.dpi / len(ranks)
        fs = min(fontsize, max(5.0, 0.55 * lane_px * 72.0 / fig.dpi))
        lane_busy_until = defaultdict(lambda: -math.inf)
        order = sorted(range(len(evs)), key=lambda i: evs[i].start)
        for i in order:
            e, lane = evs[i], lanes[i]
            x0 = (e.start - t0) * 1e3
            w = max((e.end - e.start) * 1e3, min_width)
            y = row_of[rank] - 0.4 + lane * lane_h
            color, legend = _event_style(e, color_by)
            used.setdefault(legend, color)
            rect = Rectangle((x0, y), w, lane_h * 0.92, facecolor=color, edgecolor="white",
                             linewidth=0.5, gid=f"rank{rank}")
            ax.add_patch(rect)
            # The label: inside if it fits, else beside (right) if the lane is free there.
            candidates = [_event_label(e, show_bytes), _event_label(e, False)]
            next_start = min(
                ((o.start - t0) * 1e3 for j, o in enumerate(evs)
                 if lanes[j] == lane and o.start > e.start and j != i),
                default=span_ms + pad,
            )
            placed = False
            for text in dict.fromkeys(candidates):  # unique, in order
                need = len(text) * char_px * fs / fontsize + 4
                if w * px_per_ms >= need:
                    ax.text(x0 + w / 2, y + lane_h * 0.46, text, ha="center", va="center",
                            fontsize=fs, color="white" if color in _DARK else "black",
                            clip_on=True, gid=f"label-rank{rank}")
                    placed = True
                    break
            if not placed:
                text = candidates[-1]
                need_ms = (len(text) * char_px * fs / fontsize + 6) / px_per_ms
                if x0 + w + need_ms <= next_start and x0 + w > lane_busy_until[lane]:
                    ax.text(x0 + w + 2 / px_per_ms, y + lane_h * 0.46, text, ha="left",
                            va="center", fontsize=fs, color="#333333", clip_on=True,
                            gid=f"label-rank{rank}")
                    lane_busy_until[lane] = x0 + w + need_ms
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("time since the first event (ms)")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    for i in range(1, len(ranks)):
        ax.axhline(i - 0.5, color="#EEEEEE", linewidth=0.8, zorder=0)
    if title is None:
        n_comm = sum(1 for e in events if e.is_comm)
        title = (f"What each rank did, over time: {len(events)} events "
                 f"({n_comm} communication) on {len(ranks)} ranks")
    ax.set_title(title, fontsize=11, loc="left")
    if used:
        handles = [Patch(facecolor=c, edgecolor="white", label=name) for name, c in used.items()]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
                  frameon=False, title="op" if color_by == "op" else "phase",
                  title_fontsize=8)
    return fig


def _assign_lanes(events) -> list[int]:
    """Greedy interval packing: the lowest lane whose last event has ended."""
    lanes = [0] * len(events)
    lane_ends: list[float] = []
    for i in sorted(range(len(events)), key=lambda i: (events[i].start, events[i].end)):
        e = events[i]
        for lane, end in enumerate(lane_ends):
            if end <= e.start:
                lanes[i] = lane
                lane_ends[lane] = e.end
                break
        else:
            lanes[i] = len(lane_ends)
            lane_ends.append(e.end)
    return lanes


def _event_style(e, color_by: str) -> tuple[str, str]:
    """(colour, legend entry) for one event."""
    if e.op == "compute":
        return COMPUTE_COLOR, "compute"
    if color_by == "op":
        return OP_COLORS.get(e.op, "#999999"), op_name(e.op)
    return PHASE_COLORS.get(e.phase, "#999999"), PHASE_NAMES.get(e.phase, e.phase)


def _event_label(e, show_bytes: bool) -> str:
    if e.op == "compute":
        return e.label or "compute"
    name = op_name(e.op)
    if e.op == "send" and e.peer is not None:
        name += f"→{e.peer}"
    elif e.op == "recv" and e.peer is not None:
        name += f"←{e.peer}"
    if show_bytes and e.nbytes:
        name += f" {human_bytes(e.nbytes)}"
    return name


