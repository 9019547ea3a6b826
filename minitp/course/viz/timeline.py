"""A run's trace as per-rank swimlanes over time.

Each rank's row has three bands. Compute regions (`trace.region`: "F0", the
forward of microbatch 0, or a layer) are named in the top strip, their span framed
there, and grey the height of the row only where the rank computed: a collective
the region waited in is cut out of the grey, never drawn over it. Blocking
collectives and p2p fill the middle band, coloured by phase (or by op), each
labelled "layer op axis bytes" as far as its width allows. An operation that was
*posted* and waited on later (an `isend` kept until the end of the step, a
bucket all-reduce overlapping backward) spans from its post to the end of its
wait while the rank did other work, so it is drawn as a thin bar in the bottom
strip: a wide block there would claim the rank spent the whole time sending.
"""

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

# The legend's words for a phase: "" is anything outside forward and backward
# (in a training step: the loss all-reduced so every rank can print it).
LEGEND_PHASES = {**PHASE_NAMES, "": "outside forward/backward"}
MIN_FONT = 7.0  # points: smaller labels are not drawn at all (they would not be read)
IN_FLIGHT = "posted, waited later (in flight)"


def timeline(run_or_events, ax=None, *, color_by: str = "auto", title: str | None = None,
             show_bytes: bool = True, width: float = 10.0):
    """Every rank's events over time: one swimlane per rank, one bar per event.

    run_or_events: a `Run` (its ``.trace`` is drawn, and every rank gets a lane
        even if it recorded nothing) or a list of `Event`.
    color_by: "phase" (forward / backward / outside both; compute in grey), "op"
        (one colour per kind of collective), or "auto": by phase when the trace has
        any backward event (a training step), else by op.
    Collectives that overlap on one rank (a `sendrecv`) are stacked in sub-lanes.
    A communication event that contains a compute region or two other events of
    its rank was posted and waited on later: it is drawn thin, in the bottom
    strip (see the module's docstring). Labels say the layer, the op, its axis
    and size, shortened until they fit at `MIN_FONT` points or more, and are left
    out where nothing fits. Time is in milliseconds from the first event.
    Returns the Figure.
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
    by_rank: dict[int, list] = defaultdict(list)
    for e in events:
        if e.rank in row_of:
            by_rank[e.rank].append(e)
    kinds = {rank: _kinds(evs) for rank, evs in by_rank.items()}
    has_regions = any("region" in k.values() for k in kinds.values())
    has_flight = any("flight" in k.values() for k in kinds.values())
    # The row's bands, in row units (a row is 1 tall, centred on its index).
    top, bottom = -0.44, 0.44
    mid = (top + (0.26 if has_regions else 0.0), bottom - (0.16 if has_flight else 0.0))

    if ax is None:
        fig = _new_figure((width, 1.0 + 0.7 * len(ranks)))
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
    # Pixels per millisecond and per row unit, to decide which labels fit.
    px_per_ms = ax.get_position().width * fig.get_figwidth() * fig.dpi / (span_ms + 2 * pad)
    px_per_row = ax.get_position().height * fig.get_figheight() * fig.dpi / len(ranks)

    def label(x0, w, y, h, candidates, color, gid, beside_until=None):
        """The first candidate that fits inside the bar (or beside it, up to
        `beside_until`) at MIN_FONT or more; False when none does."""
        fs = min(8.5, 0.75 * h * px_per_row * 72.0 / fig.dpi)
        if fs < MIN_FONT:
            return False
        char_ms = 0.6 * fs * fig.dpi / 72.0 / px_per_ms
        for text in dict.fromkeys(candidates):  # unique, in order
            need = (len(text) + 1) * char_ms
            if w >= need:
                ax.text(x0 + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs,
                        color="white" if color in _DARK else "black", clip_on=True, gid=gid)
                return True
            if beside_until is not None and x0 + w + need <= beside_until:
                ax.text(x0 + w + 0.3 * char_ms, y + h / 2, text, ha="left", va="center",
                        fontsize=fs, color="#333333", clip_on=True, gid=gid)
                return x0 + w + need
        return False

    used: dict[str, str] = {}  # legend entry -> colour, in order of first use
    for rank, evs in by_rank.items():
        row = row_of[rank]
        kind = kinds[rank]
        for band, (lo, hi) in (("region", (top, bottom)), ("blocking", mid),
                               ("flight", (bottom - 0.14, bottom))):
            mine = [e for e in evs if kind[id(e)] == band]
            if not mine:
                continue
            lanes = _assign_lanes(mine)
            n_lanes = max(lanes) + 1
            lane_h = (hi - lo) / n_lanes
            busy_until = defaultdict(lambda: -math.inf)  # per lane: where the last label ends
            order = sorted(range(len(mine)), key=lambda i: mine[i].start)
            for k, i in enumerate(order):
                e, lane = mine[i], lanes[i]
                x0 = (e.start - t0) * 1e3
                w = max((e.end - e.start) * 1e3, min_width)
                y = row + lo + lane * lane_h
                if band == "region":
                    color, legend = COMPUTE_COLOR, "compute"
                    # Grey fills only the stretches where the rank computed: a collective it
                    # waited in is cut out, so grey never lies under a blocking bar (the two
                    # did not overlap in the run; a posted message, in flight, really did).
                    # The region's span is its name tag, framed in the top strip, above the
                    # collectives: a box over the whole row would claim the rank computed there.
                    strip = (mid[0] - top) / n_lanes
                    ax.add_patch(Rectangle((x0, row + top + lane * strip), w, 0.9 * strip,
                                           facecolor="none", edgecolor=color, linewidth=0.8,
                                           gid=f"rank{rank}", zorder=1))
                    waits = [(b.start, b.end) for b in evs if kind[id(b)] == "blocking"]
                    for s0, s1 in _minus(e.start, e.end, waits):
                        ax.add_patch(Rectangle(((s0 - t0) * 1e3, y), (s1 - s0) * 1e3, lane_h,
                                               facecolor=color, alpha=0.45, linewidth=0,
                                               gid=f"computing-rank{rank}", zorder=1))
                    if n_lanes == 1:  # the name goes in the top strip, above the collectives
                        label(x0, w, row + top, mid[0] - top, [e.label or "compute"], "#FFFFFF",
                              f"label-rank{rank}")
                    used.setdefault(legend, color)
                    continue
                color, legend = _event_style(e, color_by)
                if band == "flight":
                    legend = IN_FLIGHT
                    color = "#888888"
                used.setdefault(legend, color)
                ax.add_patch(Rectangle((x0, y), w, lane_h * 0.9, facecolor=color,
                                       edgecolor="white", linewidth=0.4, gid=f"rank{rank}",
                                       zorder=2))
                if band == "flight" or x0 < busy_until[lane]:
                    continue
                following = [mine[j].start for j in order[k + 1:] if lanes[j] == lane]
                next_start = (min(following) - t0) * 1e3 if following else span_ms + pad
                placed = label(x0, w, y, lane_h * 0.9, _event_labels(e, show_bytes), color,
                               f"label-rank{rank}", beside_until=next_start)
                if isinstance(placed, float):
                    busy_until[lane] = placed
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("time since the first event (ms)")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    for i in range(1, len(ranks)):
        ax.axhline(i - 0.5, color="#DDDDDD", linewidth=0.8, zorder=0)
    if title is None:
        n_comm = sum(1 for e in events if e.is_comm)
        title = (f"What each rank did, over time: {len(events)} events "
                 f"({n_comm} communication) on {len(ranks)} ranks")
    ax.set_title(title, fontsize=11, loc="left")
    if used:
        handles = [Patch(facecolor=c, edgecolor="white", label=name,
                         alpha=0.45 if name == "compute" else 1.0) for name, c in used.items()]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
                  frameon=False, title="op" if color_by == "op" else "phase",
                  title_fontsize=8)
    return fig


def _minus(start: float, end: float, holes) -> list[tuple[float, float]]:
    """The stretches of [start, end) that no (s, e) in `holes` covers, in order."""
    pieces, at = [], start
    for s0, s1 in sorted(holes):
        if s1 <= at or s0 >= end:
            continue
        if s0 > at:
            pieces.append((at, s0))
        at = max(at, s1)
    if at < end:
        pieces.append((at, end))
    return pieces


def _kinds(events) -> dict[int, str]:
    """id(event) -> "region" (compute), "flight" (posted, waited later) or "blocking".

    A rank blocked in a collective does nothing else, so a communication event
    that strictly contains a compute region, or two other events, of its own
    rank was running in the background: it was posted, and waited on later.
    (Two overlapping events alone are a `sendrecv`: both blocking at once.)"""
    kinds = {}
    for e in events:
        if not e.is_comm:
            kinds[id(e)] = "region"
            continue
        inside = [o for o in events if o is not e and o.start > e.start and o.end < e.end]
        background = any(not o.is_comm for o in inside) or len(inside) >= 2
        kinds[id(e)] = "flight" if background else "blocking"
    return kinds


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
    return PHASE_COLORS.get(e.phase, "#999999"), LEGEND_PHASES.get(e.phase, e.phase)


def _event_labels(e, show_bytes: bool) -> list[str]:
    """A communication event's label, longest first: "layer2 all-gather tp 16 KiB",
    then without the size, without the layer, and the op alone."""
    name = op_name(e.op)
    if e.op == "send" and e.peer is not None:
        name += f"→{e.peer}"
    elif e.op == "recv" and e.peer is not None:
        name += f"←{e.peer}"
    axis = f" {e.axis}" if e.axis and e.axis != "p2p" else ""
    size = f" {human_bytes(e.nbytes)}" if show_bytes and e.nbytes else ""
    layer = f"{e.label} " if e.label else ""
    return [f"{layer}{name}{axis}{size}", f"{layer}{name}{axis}", f"{name}{axis}{size}",
            f"{name}{axis}", name]
