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


# --------------------------------------------------------------------------- tensor parallel
# (lessons 02 and 03) Y = XA split across ranks, and one layer's dataflow with its collectives.
def split_matmul(p: int = 4, split: str = "both", *, title: str | None = None,
                 unit: float = 0.36):
    """Y = XA split across `p` ranks, each rank's block in its colour.

    split="column": A = [A_0 … A_{p-1}] by columns; rank r computes Y_r = X A_r from
        the whole X (no communication), and Y = [Y_0 … Y_{p-1}].
    split="row": X = [X_0 … X_{p-1}] by columns and A = [A_0; …; A_{p-1}] by rows;
        rank r computes the full-size partial product X_r A_r, and Y is their sum
        (an all-reduce).
    split="both": the column split above the row split. Returns the Figure.
    """
    if split not in ("column", "row", "both"):
        raise ValueError(f"split must be 'column', 'row' or 'both', got {split!r}")
    if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= 8:
        raise ValueError(f"p must be an integer from 1 to 8 (one colour per rank), got {p!r}")
    panels = ["column", "row"] if split == "both" else [split]
    mat_w, mat_h, a_h = 4.0, 3.0, 4.0  # X and Y: 3 tall, 4 wide; A: 4 by 4 (units)
    term_w, term_gap = 2.0, 0.7  # the row split's partial products
    width = 2 * mat_w + 2 * 1.0 + max(mat_w, p * term_w + (p - 1) * term_gap) + 0.6
    panel_h = a_h + 2.1
    top = 1.2 if title else 0.55
    height = top + panel_h * len(panels)
    fig = _new_figure((width * unit, height * unit))
    fig.set_layout_engine("none")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.3, width - 0.3)
    ax.set_ylim(height, 0)
    ax.axis("off")
    fs = 9.0
    if title:
        ax.text(width / 2 - 0.3, 0.45, title, ha="center", va="center", fontsize=11)

    def block(x, y, w, h, face, text="", gid="", hatch=None):
        ax.add_patch(Rectangle((x, y), w, h, facecolor=face, edgecolor="#444444",
                               linewidth=0.9, hatch=hatch, gid=gid))
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs,
                    gid=gid + "-text" if gid else "")

    def caption(x, y, text):
        ax.text(x, y, text, ha="center", va="top", fontsize=7.5, color="#333333")

    for index, kind in enumerate(panels):
        y0 = top + index * panel_h + 0.35
        ym = y0 + a_h / 2  # the middle line of the panel
        xy = (0.0, ym - mat_h / 2)
        head = ("Column split: $A = [A_0\\ \\cdots\\ A_{p-1}]$, no communication"
                if kind == "column" else
                f"Row split: $Y = {_sum_of_terms(p)}$, summed by one all-reduce")
        ax.text(-0.2, y0 - 0.15, head.replace("p-1", str(p - 1)), ha="left", va="bottom",
                fontsize=10, weight="bold")
        strip = mat_w / p
        if kind == "column":
            block(*xy, mat_w, mat_h, "#F2F2F2", "$X$", gid="column-X")
            caption(mat_w / 2, ym + a_h / 2 + 0.15, "every rank\nholds all of X")
        else:
            for r in range(p):
                block(xy[0] + r * strip, xy[1], strip, mat_h, _tint(rank_color(r)),
                      f"$X_{r}$", gid=f"row-X{r}")
            caption(mat_w / 2, ym + a_h / 2 + 0.15, "rank r holds\nthe columns $X_r$")
        ax.text(mat_w + 0.5, ym, "×", ha="center", va="center", fontsize=14)
        xa = mat_w + 1.0
        for r in range(p):
            if kind == "column":
                block(xa + r * strip, y0, strip, a_h, _tint(rank_color(r)), f"$A_{r}$",
                      gid=f"column-A{r}")
            else:
                block(xa, y0 + r * a_h / p, mat_w, a_h / p, _tint(rank_color(r)), f"$A_{r}$",
                      gid=f"row-A{r}")
        caption(xa + mat_w / 2, y0 + a_h + 0.15,
                "rank r holds\nthe column block $A_r$" if kind == "column"
                else "rank r holds\nthe row block $A_r$")
        ax.text(xa + mat_w + 0.5, ym, "=", ha="center", va="center", fontsize=14)
        xy_out = xa + mat_w + 1.0
        if kind == "column":
            for r in range(p):
                block(xy_out + r * strip, ym - mat_h / 2, strip, mat_h, _tint(rank_color(r)),
                      f"$Y_{r}$", gid=f"column-Y{r}")
            caption(xy_out + mat_w / 2, ym + a_h / 2 + 0.15,
                    "rank r computes\nits columns $Y_r = XA_r$")
        else:
            term_h = mat_h * term_w / mat_w
            for r in range(p):
                x = xy_out + r * (term_w + term_gap)
                block(x, ym - term_h / 2, term_w, term_h, _tint(rank_color(r)),
                      f"$X_{r}A_{r}$", gid=f"row-term{r}")
                ax.text(x + term_w / 2, ym + term_h / 2 + 0.12, f"rank {r}", ha="center",
                        va="top", fontsize=7.5, color="#333333")
                if r < p - 1:
                    ax.text(x + term_w + term_gap / 2, ym, "+", ha="center", va="center",
                            fontsize=13)
            span = p * term_w + (p - 1) * term_gap
            caption(xy_out + span / 2, ym + a_h / 2 + 0.15,
                    "each rank computes a full-size term;\nan all-reduce adds them")
    return fig


def _sum_of_terms(p: int) -> str:
    """X_0A_0 + X_1A_1 + … in mathtext, with an ellipsis beyond three terms."""
    if p <= 3:
        return " + ".join(f"X_{r}A_{r}" for r in range(p))
    return f"X_0A_0 + X_1A_1 + \\cdots + X_{{{p - 1}}}A_{{{p - 1}}}"


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
    fig = _new_figure((width * unit, height * unit))
    fig.set_layout_engine("none")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.6, width - 0.6)
    ax.set_ylim(height, 0)
    ax.axis("off")
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


# --------------------------------------------------------------------------- lessons 04-06
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
               width: float = 10.0):
    """Bytes one rank sent, per part of the model (trace label), for several runs side by side.

    runs: {setting name: Run or list of Event}, e.g. {"TP": run_tp, "TP + SP": run_sp}.
    labels: which trace labels to show (default: every label with communication, in
        model order: embedding, layer0, …, head, loss, then the rest). Nested labels
        ("layer0.attn") count towards their first component.
    Each bar is one setting's bytes for one label, stacked by collective (colour) and
    pass (forward plain, backward hatched); its total is written above it.
    Returns the Figure.
    """
    if not runs:
        raise ValueError("wire_bytes needs at least one run")
    totals: dict[str, dict[str, dict[tuple[str, str], int]]] = {}
    for name, run in runs.items():
        per_label: dict[str, dict[tuple[str, str], int]] = defaultdict(lambda: defaultdict(int))
        for e in getattr(run, "trace", run):
            if e.rank != rank or not e.is_comm or not e.wire_bytes:
                continue
            label = (e.label or "(no label)").split(".")[0]
            per_label[label][(e.op, "bwd" if e.phase == "bwd" else "fwd")] += e.wire_bytes
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
    ax.set_ylabel(f"bytes rank {rank} sent (ring model)")
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=c, edgecolor="white", label=op) for op, c in ops_used.items()]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///",
                         label="hatched: backward"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              frameon=False)
    ax.set_title(title or "Bytes sent per part of the model, "
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


# --------------------------------------------------------------------------- planning
# (lesson 10) what a configuration costs, from minitp.calc: memory by kind, time by part.
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


# --------------------------------------------------------------------------- scaling
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
