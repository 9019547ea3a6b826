"""2D tensor parallelism drawn: the q × q grid's blocks, and 1D vs 2D bytes, latency terms
and collectives against N (per linear layer)."""

from __future__ import annotations

import matplotlib.ticker as mticker
from matplotlib.patches import Rectangle

from ...calc.network.two_d import tp1d_linear_bytes, tp2d_linear_bytes, tp_linear_latency
from ._style import _DARK, OKABE_ITO, _new_figure, _tint, human_bytes


def summa_grid(q: int = 2, rank: int = 1):
    """X (tokens × d_in), W (d_in × d_out) and Y = XW in q × q blocks, each block in the
    colour of the rank that holds it (rank (i, j) = i·q + j holds X_ij, W_ij, Y_ij).

    For one `rank`, the blocks it needs to compute its Y_ij are drawn with a thick
    border: row i of X (held by its grid row) and column j of W (held by its grid
    column). Every block is a Rectangle with ``gid="X{i}{j}"`` (W, Y alike).
    Returns the Figure.
    """
    if not 0 <= rank < q * q:
        raise ValueError(f"rank must be in 0..{q * q - 1}, got {rank}")
    me_i, me_j = divmod(rank, q)
    fig = _new_figure((9.5, 3.4))
    axes = fig.subplots(1, 3)
    panels = (("X", "X: tokens × d_in", lambda i, j: i == me_i),
              ("W", "W: d_in × d_out", lambda i, j: j == me_j),
              ("Y", "Y = XW: tokens × d_out", lambda i, j: (i, j) == (me_i, me_j)))
    for ax, (name, title, needed) in zip(axes, panels, strict=True):
        for i in range(q):
            for j in range(q):
                owner = i * q + j
                color = OKABE_ITO[owner % len(OKABE_ITO)]
                bold = needed(i, j)
                ax.add_patch(Rectangle((j + 0.05, i + 0.05), 0.9, 0.9, gid=f"{name}{i}{j}",
                                       facecolor=color if bold else _tint(color, 0.35),
                                       edgecolor="black", linewidth=2.6 if bold else 0.6))
                ink = "white" if bold and color in _DARK else "black"
                ax.text(j + 0.5, i + 0.5, f"{name}$_{{{i}{j}}}$\nrank {owner}", ha="center",
                        va="center", fontsize=8, color=ink)
        ax.set_xlim(0, q)
        ax.set_ylim(q, 0)
        ax.set_aspect("equal")
        ax.set_xticks([j + 0.5 for j in range(q)], [f"col {j}" for j in range(q)])
        ax.set_yticks([i + 0.5 for i in range(q)], [f"row {i}" for i in range(q)])
        ax.tick_params(length=0, labelsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"A {q} × {q} grid. Rank {rank} = ({me_i}, {me_j}) computes "
                 f"Y$_{{{me_i}{me_j}}}$ = Σ$_k$ X$_{{{me_i}k}}$ W$_{{k{me_j}}}$: "
                 f"bold, the X blocks of its grid row and the W blocks of its grid column",
                 fontsize=10)
    return fig


def _feasible(ns, tokens: int, d: int, heads: int | None):
    """1D: N divides the heads (a bare layer: d), so N ≤ heads. 2D: N = q² with q
    dividing d, the heads and the tokens (whole blocks on every rank)."""
    split = heads or d
    one = [n for n in ns if n >= 2 and split % n == 0]
    two = [n for n in ns if n >= 4 and (q := round(n ** 0.5)) ** 2 == n
           and not (d % q or split % q or tokens % q)]
    return one, two


def bytes_vs_n(shapes, ns=range(2, 1025), bytes_per_value: int = 2, measured=None,
               gloo: bool = False):
    """Per linear layer, forward + backward, all from `minitp.calc.network.two_d` (a MODEL):
    left, the bytes one rank sends against N; middle, the latency terms (α, one per
    sequential ring/chain step); right, the collectives. One colour per shape in
    `shapes`: (tokens, d) for a bare layer or (tokens, d, heads), d_in = d_out = d.

    Each scheme is drawn only at the N where it can run (`_feasible`): 1D (solid;
    1D with sequence parallelism sends the same bytes) stops at its last N; 2D saved
    (`Linear2D`, dashed) and 2D re-gathered (Optimus, dash-dot) at square N. Open
    circles: the first N where each 2D variant sends fewer bytes than 1D's formula at
    the same N. ``measured``: optional [(n, scheme, tokens, d, bytes)] drawn as
    markers (scheme "1d" or "2d"); ``gloo``: also 2D saved with gloo's reduce-scatter
    (dotted), what CPU ranks send. The middle and right panels use the last shape's
    N; legends sit below the panels. Returns the Figure.
    """
    ns = sorted(ns)
    fig = _new_figure((14, 6.2))
    left, middle, right = fig.subplots(1, 3)
    for k, (tokens, d, *rest) in enumerate(shapes):
        heads = rest[0] if rest else None
        color = OKABE_ITO[k % len(OKABE_ITO)]
        n1, n2 = _feasible(ns, tokens, d, heads)
        name = f"T={tokens}, d={d}" + (f", {heads} heads" if heads else "")
        one = [tp1d_linear_bytes(tokens, d, d, n, bytes_per_value=bytes_per_value) for n in n1]
        left.plot(n1, one, "-", color=color, marker=".", ms=4,
                  label=f"{name}: 1D or 1D+SP, up to N={n1[-1]} (model)")
        for regather, style, what in ((False, "--", "2D saved"), (True, "-.", "2D re-gather")):
            two = [tp2d_linear_bytes(tokens, d, d, round(n ** 0.5), regather=regather,
                                     bytes_per_value=bytes_per_value) for n in n2]
            left.plot(n2, two, style, color=color, label=f"{name}: {what} (model)")
            wins = next((n for n, b in zip(n2, two, strict=True) if b < tp1d_linear_bytes(
                tokens, d, d, n, bytes_per_value=bytes_per_value)), None)
            if wins is not None:
                left.plot([wins], [two[n2.index(wins)]], "o", mfc="white", color=color, ms=8)
        if gloo:
            left.plot(n2, [tp2d_linear_bytes(tokens, d, d, round(n ** 0.5), gloo=True,
                                             bytes_per_value=bytes_per_value) for n in n2],
                      ":", color=color, label=f"{name}: 2D saved, gloo's reduce-scatter "
                      "(model)")
    for n, scheme, tokens, d, sent in measured or ():
        k = [shape[:2] for shape in shapes].index((tokens, d))
        left.plot([n], [sent], "x" if scheme == "1d" else "+", color=OKABE_ITO[k], ms=10, mew=2)
    if measured:
        left.plot([], [], "kx", label="measured 1D (gloo)")
        left.plot([], [], "k+", label="measured 2D saved (gloo)")
    left.yaxis.set_major_locator(mticker.LogLocator(base=2))  # 64 KiB, 128 KiB, ...: round in KiB
    left.yaxis.set_minor_locator(mticker.NullLocator())
    left.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: human_bytes(v)))
    left.set_ylabel("bytes one rank sends per linear layer")
    left.set_title("Bytes per rank: each 2D variant wins from its open circle", fontsize=9)
    tokens, d, *rest = shapes[-1]
    n1, n2 = _feasible(ns, tokens, d, rest[0] if rest else None)
    for scheme, style, color, name, where in (
            ("1d", "-", "black", "1D (1 all-reduce)", n1),
            ("1d-sp", ":", "#999999", "1D+SP (all-gather + reduce-scatter)", n1),
            ("2d", "--", "#0072B2", "2D saved", n2),
            ("2d-regather", "-.", "#009E73", "2D re-gather", n2),
            ("2d-broadcast", (0, (1, 1)), "#D55E00", "2D saved, SUMMA broadcasts", n2)):
        counts = [tp_linear_latency(scheme, n) for n in where]
        middle.plot(where, [c["alpha"] for c in counts], linestyle=style, color=color,
                    label=f"{name} (model)")
        right.plot(where, [c["collectives"] for c in counts], linestyle=style, color=color,
                   marker=".", ms=4, label=name)
    middle.set_ylabel("α terms (sequential steps) per linear layer")
    middle.set_title("Latency terms (a MODEL)", fontsize=9)
    right.set_ylabel("collectives per linear layer")
    right.set_title("Collectives per linear layer", fontsize=9)
    for ax in (left, middle, right):
        ticks = [n for n in (2, 4, 8, 16, 36, 64, 96, 256, 1024) if ns[0] <= n <= ns[-1]]
        ax.set_xscale("log")
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set_xlabel("ranks N (2D: a √N × √N grid)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    left.set_yscale("log")
    middle.set_yscale("log")
    return fig
