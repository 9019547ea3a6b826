"""A collective's data before and after, and bandwidth with an α–β fit."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ._style import OKABE_ITO, _new_figure, _tint, human_bytes, human_seconds, rank_color


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


