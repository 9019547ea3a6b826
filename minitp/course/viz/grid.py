"""2D tensor parallelism drawn: the q × q grid's blocks, and 1D vs 2D bytes against N."""

from __future__ import annotations

import matplotlib.ticker as mticker
from matplotlib.patches import Rectangle

from ...calc.two_d import tp1d_linear_bytes, tp2d_linear_bytes, tp_linear_latency
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


def bytes_vs_n(shapes, ns=(4, 9, 16, 36, 49, 64, 144, 256, 1024), bytes_per_value: int = 2,
               measured=None, gloo: bool = False):
    """Left: bytes one rank sends for one linear layer (forward + backward) against N,
    1D (solid) and 2D (dashed), one colour per (tokens, d) in `shapes` (d_in = d_out
    = d), all from `minitp.calc.two_d`: a MODEL. ``measured``: optional
    [(n, scheme, tokens, d, bytes)] drawn as markers on top (scheme "1d" or "2d");
    ``gloo``: also 2D's model with gloo's reduce-scatter (dotted), what CPU ranks send.
    Right: the collectives and the latency terms (α) per layer against N.
    Returns the Figure.
    """
    ns = sorted(ns)
    fig = _new_figure((11, 4.0))
    left, right = fig.subplots(1, 2)
    for k, (tokens, d) in enumerate(shapes):
        color = OKABE_ITO[k % len(OKABE_ITO)]
        one = [tp1d_linear_bytes(tokens, d, d, n, bytes_per_value=bytes_per_value) for n in ns]
        two = [tp2d_linear_bytes(tokens, d, d, round(n ** 0.5), bytes_per_value=bytes_per_value)
               for n in ns]
        left.plot(ns, one, "-", color=color, label=f"T={tokens}, d={d}: 1D (model)")
        left.plot(ns, two, "--", color=color, label=f"T={tokens}, d={d}: 2D (model)")
        if gloo:
            left.plot(ns, [tp2d_linear_bytes(tokens, d, d, round(n ** 0.5), gloo=True,
                                             bytes_per_value=bytes_per_value) for n in ns],
                      ":", color=color, label=f"T={tokens}, d={d}: 2D, gloo's reduce-scatter "
                      "(model)")
        wins = next((n for n, a, b in zip(ns, one, two, strict=True) if b < a), None)
        if wins is not None:
            left.plot([wins], [two[ns.index(wins)]], "o", mfc="white", color=color, ms=8)
    for n, scheme, tokens, d, sent in measured or ():
        k = list(shapes).index((tokens, d))
        left.plot([n], [sent], "x" if scheme == "1d" else "+", color=OKABE_ITO[k], ms=10, mew=2)
    if measured:
        left.plot([], [], "kx", label="measured 1D (gloo)")
        left.plot([], [], "k+", label="measured 2D (gloo)")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xticks(ns, [str(n) for n in ns])
    left.xaxis.set_minor_locator(mticker.NullLocator())
    left.yaxis.set_major_locator(mticker.LogLocator(base=2))  # 64 KiB, 128 KiB, ...: round in KiB
    left.yaxis.set_minor_locator(mticker.NullLocator())
    left.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: human_bytes(v)))
    left.set_xlabel("ranks N (2D: a √N × √N grid)")
    left.set_ylabel("bytes one rank sends per layer")
    left.set_title("Bytes per rank: 2D wins from the open circle on (d < √N·T)", fontsize=9)
    left.legend(fontsize=7)
    for scheme, style, name in (("1d", "-", "1D"), ("2d", "--", "2D, all-gathers"),
                                ("2d-broadcast", ":", "2D, SUMMA broadcasts")):
        counts = [tp_linear_latency(scheme, n) for n in ns]
        right.plot(ns, [c["alpha"] for c in counts], style, color="#0072B2",
                   label=f"{name}: α terms (model)")
        right.plot(ns, [c["collectives"] for c in counts], style, color="#D55E00",
                   label=f"{name}: collectives")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xticks(ns, [str(n) for n in ns])
    right.xaxis.set_minor_locator(mticker.NullLocator())
    right.set_xlabel("ranks N")
    right.set_ylabel("per layer, forward + backward")
    right.set_title("Latency: sequential ring/chain steps (α) and collectives", fontsize=9)
    right.legend(fontsize=7)
    return fig
