"""Y = XA split across ranks, drawn (lesson 02): by columns, by rows, or both."""

from __future__ import annotations

from matplotlib.patches import Rectangle

from ._style import _canvas, _tint, rank_color


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
    fig, ax = _canvas(width, height, unit, left=0.3)
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
