"""The pipeline Gantt chart: which stage ran which microbatch's forward and backward, when."""

from __future__ import annotations

from matplotlib.patches import Patch, Rectangle

from ...rules import parse_unit_label
from ._style import PHASE_COLORS, _new_figure, _tint

IDLE_COLOR = "#E8E8E8"
WEIGHT_PASS_COLOR = "#009E73"  # a zero-bubble schedule's W passes: their own colour


def pipeline_units(run_or_events) -> list:
    """The compute events of a pipeline schedule (labels "F3", "B3", "F3:1")."""
    events = getattr(run_or_events, "trace", run_or_events)
    return [e for e in events if e.op == "compute" and e.label and parse_unit_label(e.label)]


def pipeline_bubble(run_or_events) -> float:
    """Measured bubble: mean over ranks of idle / busy, idle counted within the span
    of every rank's forward and backward units (the measure behind (p−1)/m)."""
    units = pipeline_units(run_or_events)
    if not units:
        raise ValueError("pipeline_bubble: the trace has no forward/backward units")
    start, end = min(e.start for e in units), max(e.end for e in units)
    ratios = []
    for r in sorted({e.rank for e in units}):
        busy = sum(e.end - e.start for e in units if e.rank == r)
        ratios.append((end - start - busy) / busy)
    return sum(ratios) / len(ratios)


def pipeline_gantt(run_or_events, ax=None, *, ranks=None, title: str | None = None,
                   width: float = 10.0):
    """Forward (blue) and backward (vermillion) of each microbatch as a box per rank
    over time, numbered by microbatch — a zero-bubble schedule's B in vermillion and its
    W (the weight gradients) in green; a chunk k > 0 of an interleaved schedule in a
    lighter shade, its box labelled "3:1". Idle time within the step is shaded
    grey, and the measured bubble (idle / busy, mean over ranks) is in the title.
    Every box is where and how long the trace says the unit ran: measured. What made
    a unit last that long (its compute, or a cost set by the caller, as lesson 11
    does with sleep) the trace cannot tell; the caller's title should say.

    run_or_events: a `Run` or a list of `Event`. ranks: which ranks to draw (default
    all that ran units; with tensor parallelism pass one rank per stage, e.g. tp rank 0).
    Returns the Figure.
    """
    units = pipeline_units(run_or_events)
    if ranks is not None:
        units = [e for e in units if e.rank in set(ranks)]
    if not units:
        raise ValueError("pipeline_gantt: the trace has no forward/backward units to draw")
    lanes = sorted({e.rank for e in units})
    row = {r: i for i, r in enumerate(lanes)}
    t0, t1 = min(e.start for e in units), max(e.end for e in units)
    span = max((t1 - t0) * 1e3, 1e-6)
    if ax is None:
        fig = _new_figure((width, 0.9 + 0.5 * len(lanes)))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    for r in lanes:  # idle: the whole span shaded, the units drawn over it
        ax.add_patch(Rectangle((0, row[r] - 0.4), span, 0.8, facecolor=IDLE_COLOR,
                               edgecolor="none", hatch="///", linewidth=0, zorder=1))
    px_per_ms = width * fig.dpi * 0.8 / span
    for e in units:
        kind, _, chunk = parse_unit_label(e.label)
        base = WEIGHT_PASS_COLOR if kind == "W" else PHASE_COLORS["fwd" if kind == "F" else "bwd"]
        color = base if chunk == 0 else _tint(base, 0.55)
        x0, w = (e.start - t0) * 1e3, (e.end - e.start) * 1e3
        ax.add_patch(Rectangle((x0, row[e.rank] - 0.4), w, 0.8, facecolor=color,
                               edgecolor="white", linewidth=0.6, zorder=2, gid=e.label))
        text = e.label[1:]  # "3" or, with virtual stages, "3:1"
        if w * px_per_ms >= 5.5 * len(text) + 2:
            ax.text(x0 + w / 2, row[e.rank], text, ha="center", va="center", fontsize=7,
                    color="white" if color == base else "black", zorder=3, clip_on=True)
    ax.set_xlim(0, span)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(lanes)), [f"rank {r}" for r in lanes])
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("time since the first unit (ms)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    bubble = pipeline_bubble(units)
    head = title if title is not None else "Pipeline schedule"
    ax.set_title(f"{head}: measured bubble {bubble:.1%} (idle / busy)", fontsize=11, loc="left")
    handles = [Patch(facecolor=PHASE_COLORS["fwd"], label="forward"),
               Patch(facecolor=PHASE_COLORS["bwd"], label="backward (B: input gradient)"
                     if any(parse_unit_label(e.label)[0] == "W" for e in units) else "backward")]
    if any(parse_unit_label(e.label)[0] == "W" for e in units):
        handles.append(Patch(facecolor=WEIGHT_PASS_COLOR, label="W: weight gradients"))
    if any(parse_unit_label(e.label)[2] != 0 for e in units):
        handles += [Patch(facecolor=_tint(PHASE_COLORS["fwd"], 0.55), label="forward, chunk ≥ 1"),
                    Patch(facecolor=_tint(PHASE_COLORS["bwd"], 0.55), label="backward, chunk ≥ 1")]
    handles.append(Patch(facecolor=IDLE_COLOR, hatch="///", label="idle"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              frameon=False)
    return fig
