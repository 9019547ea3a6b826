"""Pictures of what a launched run did.

    mt.viz.timeline(run)                       # every rank's events over time, one swimlane each
    mt.viz.before_after(before, after, op=...) # a collective's data, rank by rank, before and after
    mt.viz.bandwidth(sizes, seconds)           # time vs message size, with t = α + n·β fitted

Each function draws with matplotlib's object API and returns the `Figure`: a
notebook displays it (once) when it is a cell's last expression; a script saves
it with ``fig.savefig("picture.png")``. Nothing here calls ``plt.show()``.

Colours are the Okabe–Ito palette, which stays distinguishable under the common
kinds of colour blindness; shapes and text carry the same information as colour.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import matplotlib
import matplotlib.pyplot as plt  # only to create figures; see _new_figure
import numpy as np
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

# Okabe & Ito (2008), "Color Universal Design". One colour per rank, in this order.
OKABE_ITO = [
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#D55E00",  # vermillion
    "#F0E442",  # yellow
    "#000000",  # black
]
PHASE_COLORS = {"fwd": "#0072B2", "bwd": "#D55E00", "": "#CC79A7"}
PHASE_NAMES = {"fwd": "forward", "bwd": "backward", "": "neither"}
COMPUTE_COLOR = "#BBBBBB"
OP_COLORS = {
    "all_reduce": "#0072B2",
    "all_gather": "#009E73",
    "reduce_scatter": "#E69F00",
    "broadcast": "#CC79A7",
    "send": "#56B4E9",
    "recv": "#F0E442",
    "barrier": "#000000",
    "compute": COMPUTE_COLOR,
}
_DARK = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000"}  # write white text on these


def rank_color(rank: int) -> str:
    """The colour of `rank` in every picture (it cycles after 8 ranks)."""
    return OKABE_ITO[rank % len(OKABE_ITO)]


def _tint(color: str, amount: float = 0.45) -> tuple[float, float, float]:
    """`color` mixed with white: `amount` of the colour, the rest white (for cell fills)."""
    rgb = np.array(matplotlib.colors.to_rgb(color))
    return tuple(rgb * amount + (1.0 - amount))


def _new_figure(figsize) -> matplotlib.figure.Figure:
    """A figure that a notebook shows exactly once: when it is returned.

    Created through pyplot so that Jupyter's inline backend is set up (that is
    what registers the hook that displays a returned Figure as an image), then
    closed at once so pyplot does not *also* show it at the end of the cell.
    """
    fig = plt.figure(figsize=figsize, layout="constrained")
    plt.close(fig)
    return fig


# --------------------------------------------------------------------------- units
def human_bytes(n: float) -> str:
    """Bytes for people, in powers of 1024: 16 B, 1 KiB, 1.5 KiB, 48 KiB, 8 MiB."""
    n = float(n)
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if abs(n) < 1024 or unit == "TiB":
            return f"{_three_digits(n)} {unit}"
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    """A duration for people: 850 ns, 42 µs, 3.5 ms, 1.2 s."""
    s = float(s)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(s) >= scale:
            return f"{_three_digits(s / scale)} {unit}"
    return f"{_three_digits(s / 1e-9)} ns"


def _three_digits(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def op_name(op: str) -> str:
    """How the prose writes an op: all_reduce -> all-reduce."""
    return op.replace("_", "-")


# --------------------------------------------------------------------------- timeline
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


# --------------------------------------------------------------------------- before / after
def before_after(before, after, title: str | None = None, *, op: str = "", origin=None,
                 fmt=None, cell: float = 0.42):
    """A collective's data on every rank, before (left) and after (right).

    before, after: one entry per rank, each a 1-D or 2-D tensor / array / list,
        or None for "holds nothing yet" (a receive buffer, a broadcast target).
    op: written on the arrow between the two columns, e.g. "all-reduce (sum)".
    origin: where each *after* cell came from, one entry per rank shaped like
        ``after[r]``: a rank number, -1 for "a sum over every rank", or None for
        "unknown". Left out, it is worked out from the values: a value that only
        one rank held before comes from that rank; a value equal to the sum over
        ranks at some position is a sum of every rank's contribution. Give every
        rank distinct values (e.g. 10·(r+1) + i) and the inference is exact.
    Before, each cell wears its rank's colour. After, a cell wears the colour of
    the rank it came from; a sum is grey with a strip of every contributor's colour.
    Returns the Figure.
    """
    before = [_as_grid(b) for b in before]
    after = [_as_grid(a) for a in after]
    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} ranks but after has {len(after)}")
    n = len(before)
    if origin is not None:
        origins = [_origin_grid(o, a) for o, a in zip(origin, after, strict=True)]
    else:
        origins = _infer_origins(before, after)
    fmt = fmt or _value_format([g for g in before + after if g is not None])

    cols_b = max((g.shape[1] for g in before if g is not None), default=1)
    cols_a = max((g.shape[1] for g in after if g is not None), default=1)
    rows = [max(_rows(b), _rows(a)) for b, a in zip(before, after, strict=True)]
    gap_rank = 0.5  # between ranks, in cells

    # Everything is laid out in "cell" units on one axes that fills the figure, so that
    # a cell is exactly `cell` inches and the text sizes below can be worked out.
    char_cells = 0.6 * 9 / 72 / cell  # width of one 9-point character, in cells
    arrow_gap = max(2.6, len(op) * char_cells + 0.8)
    x_after = cols_b + arrow_gap
    content_w = x_after + cols_a
    content_h = sum(rows) + gap_rank * (n - 1)
    if title is None:
        title = f"{op}: every rank's data, before and after" if op else (
            "every rank's data, before and after")
    handles = [Patch(facecolor=_tint(rank_color(r)), edgecolor="#555555", label=f"rank {r}'s data")
               for r in range(n) if before[r] is not None]
    any_sum = any(o is not None and bool((o == -1).any()) for o in origins)
    if any_sum:
        handles.append(Patch(facecolor="#F2F2F2", edgecolor="#555555",
                             label="a sum (the strip: whose data is in it)"))
    left, right = 2.0, 0.4
    width = max(content_w + left + right, len(title) * 0.6 * 11 / 72 / cell + 0.8)
    extra = width - (content_w + left + right)
    left, right = left + extra / 2, right + extra / 2
    legend_cols = max(1, min(len(handles), int(width * cell / 2.1)))
    legend_rows = math.ceil(len(handles) / legend_cols) if handles else 0
    top, bottom = 1.9, 0.5 + legend_rows * 0.22 / cell
    height = content_h + top + bottom

    fig = _new_figure((width * cell, height * cell))
    fig.set_layout_engine("none")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-left, content_w + right)
    ax.set_ylim(content_h + bottom, -top)
    ax.axis("off")
    cell_pt = cell * 72
    value_fs = min(10.0, 0.85 * cell_pt / (0.62 * max(_max_len(before + after, fmt), 2)))

    ax.text((content_w + right - left) / 2, -top + 0.45, title, ha="center", va="center",
            fontsize=11)  # centred on the figure, which was made wide enough for it
    ax.text(cols_b / 2, -0.55, "before", ha="center", va="center", fontsize=10, weight="bold")
    ax.text(x_after + cols_a / 2, -0.55, "after", ha="center", va="center", fontsize=10,
            weight="bold")
    y = 0.0
    for r in range(n):
        ax.text(-0.25, y + rows[r] / 2, f"rank {r}", ha="right", va="center", fontsize=9)
        _draw_grid(ax, before[r], 0.0, y, fmt, value_fs, lambda i, j, r=r: r, n, f"before{r}")
        _draw_grid(ax, after[r], x_after, y, fmt, value_fs,
                   lambda i, j, o=origins[r]: None if o is None else o[i, j], n, f"after{r}")
        y += rows[r] + gap_rank
    mid = content_h / 2
    ax.annotate("", xy=(x_after - 0.3, mid), xytext=(cols_b + 0.3, mid),
                arrowprops=dict(arrowstyle="-|>", linewidth=2, color="#444444",
                                mutation_scale=18))
    if op:
        ax.text(cols_b + arrow_gap / 2, mid - 0.3, op, ha="center", va="bottom", fontsize=9,
                color="#222222")
    if handles:
        # matplotlib fills a legend column by column; order the handles so it reads in rows.
        handles = [handles[i * legend_cols + j] for j in range(legend_cols)
                   for i in range(legend_rows) if i * legend_cols + j < len(handles)]
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0),
                  ncol=legend_cols, fontsize=8, frameon=False, handlelength=1.4,
                  columnspacing=1.2)
    return fig


def _as_grid(x):
    """A 2-D float numpy array (a 1-D input becomes one row), or None."""
    if x is None:
        return None
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=float)
    if arr.ndim == 0:
        arr = arr.reshape(1, 1)
    elif arr.ndim == 1:
        arr = arr.reshape(1, -1)
    elif arr.ndim != 2:
        raise ValueError(f"before_after draws 1-D or 2-D data, got shape {arr.shape}")
    return arr


def _rows(g) -> int:
    return 1 if g is None else g.shape[0]


def _origin_grid(o, after):
    if o is None or after is None:
        return None
    grid = np.full(after.shape, -2, dtype=int)  # -2: unknown
    given = np.asarray(o, dtype=object).reshape(after.shape)
    for idx, v in np.ndenumerate(given):
        grid[idx] = -2 if v is None else int(v)
    return grid


def _key(v: float):
    return round(float(v), 9)


def _infer_origins(before, after):
    owners: dict = defaultdict(set)
    for r, b in enumerate(before):
        if b is not None:
            for v in b.flat:
                owners[_key(v)].add(r)
    sums = set()
    present = [b for b in before if b is not None]
    if len(present) > 1 and len({b.size for b in present}) == 1:
        sums = {_key(v) for v in np.sum([b.ravel() for b in present], axis=0)}
    out = []
    for a in after:
        if a is None:
            out.append(None)
            continue
        grid = np.full(a.shape, -2, dtype=int)
        for idx, v in np.ndenumerate(a):
            who = owners.get(_key(v), set())
            if len(who) == 1:
                grid[idx] = next(iter(who))
            elif _key(v) in sums:
                grid[idx] = -1
        out.append(grid)
    return out


def _value_format(grids):
    values = np.concatenate([g.ravel() for g in grids]) if grids else np.zeros(1)
    if np.all(np.isfinite(values)) and np.all(values == np.round(values)):
        return lambda v: f"{v:.0f}"
    return lambda v: f"{v:.3g}"


def _max_len(grids, fmt) -> int:
    return max((len(fmt(v)) for g in grids if g is not None for v in g.flat), default=1)


def _draw_grid(ax, grid, x0, y0, fmt, fontsize, origin_of, n_ranks, gid):
    if grid is None:
        ax.text(x0 + 0.1, y0 + 0.5, "(nothing yet)", ha="left", va="center", fontsize=8,
                style="italic", color="#777777", gid=gid)
        return
    for (i, j), v in np.ndenumerate(grid):
        who = origin_of(i, j)
        x, y = x0 + j, y0 + i
        if who is None or who == -2:
            face = "white"
        elif who == -1:
            face = "#F2F2F2"
        else:
            face = _tint(rank_color(who))
        ax.add_patch(Rectangle((x, y), 1, 1, facecolor=face, edgecolor="#555555",
                               linewidth=0.8, gid=gid))
        if who == -1:  # a sum: a strip of every contributor's colour along the bottom
            seg = 1.0 / n_ranks
            for k in range(n_ranks):
                ax.add_patch(Rectangle((x + k * seg, y + 0.78), seg, 0.22,
                                       facecolor=rank_color(k), edgecolor="none",
                                       gid=f"{gid}-strip"))
        ax.text(x + 0.5, y + (0.42 if who == -1 else 0.5), fmt(v), ha="center", va="center",
                fontsize=fontsize, color="black", gid=gid)


# --------------------------------------------------------------------------- bandwidth
@dataclass(frozen=True)
class AlphaBeta:
    """The α–β cost model t(n) = α + n·β: α a fixed cost per message (latency),
    β seconds per byte (1/β is the bandwidth in bytes per second)."""

    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        """Bytes per second: 1/β."""
        return 1.0 / self.beta

    def predict(self, nbytes):
        return self.alpha + np.asarray(nbytes, dtype=float) * self.beta

    def __str__(self) -> str:
        return (f"α = {human_seconds(self.alpha)}, β = {self.beta * 1e9:.3g} ns/B "
                f"({human_bytes(self.bandwidth)}/s)")


def fit_alpha_beta(sizes_bytes, seconds) -> AlphaBeta:
    """Least-squares fit of t = α + n·β, each point weighted by 1/t.

    Weighting by 1/t minimises the *relative* error, so a 1 KiB message that
    takes 50 µs counts as much as an 8 MiB one that takes 20 ms; an unweighted
    fit would let the largest sizes decide everything and leave α to noise.
    """
    n = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if n.shape != t.shape or n.size < 2:
        raise ValueError("fit_alpha_beta needs two or more (size, time) pairs of equal length")
    w = 1.0 / t
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    return AlphaBeta(float(alpha), float(beta))


def bandwidth(sizes_bytes, seconds, fit=None, *, ax=None, title: str | None = None,
              label: str = "measured"):
    """Measured time against message size (log–log), with the fitted t = α + n·β.

    seconds: one time per size, or a dict {series label: times} to draw several
        series (e.g. {"world 2": ..., "world 4": ...}) over the same sizes.
    fit: None fits each series here (`fit_alpha_beta`); an `AlphaBeta` (or a
        dict of them, by series label) draws the line you give; False draws none.
    The legend gives each fit's α, β and bandwidth 1/β. Returns the Figure.
    """
    sizes = np.asarray(sizes_bytes, dtype=float)
    series = dict(seconds) if isinstance(seconds, dict) else {label: seconds}
    if ax is None:
        fig = _new_figure((7.0, 4.6))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    dense = np.logspace(np.log10(sizes.min()), np.log10(sizes.max()), 100)
    for k, (name, times) in enumerate(series.items()):
        times = np.asarray(times, dtype=float)
        color = OKABE_ITO[k % len(OKABE_ITO)]
        ax.plot(sizes, times, "o", color=color, markersize=6, label=f"{name}: measured",
                gid=f"points-{name}")
        model = fit.get(name) if isinstance(fit, dict) else fit
        if model is None:
            model = fit_alpha_beta(sizes, times)
        if model is not False:
            ax.plot(dense, model.predict(dense), "--", color=color, linewidth=1.5,
                    label=f"{name}: fit {model}", gid=f"fit-{name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human_seconds(v)))
    ax.set_xlabel("message size n (bytes of the tensor)")
    ax.set_ylabel("time t")
    ax.grid(which="major", color="#DDDDDD", linewidth=0.6)
    # Below the plot, one column per series (matplotlib fills columns first), clear of the data.
    ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=min(len(series), 3))
    ax.set_title(title or "Time against message size, with t = α + n·β fitted", fontsize=11,
                 loc="left")
    return fig
