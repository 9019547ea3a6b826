"""Colours, figure creation and units shared by every picture."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt  # only to create figures; see _new_figure
import numpy as np

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
    "all_to_all": "#D55E00",
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


def _canvas(width: float, height: float, unit: float, left: float):
    """A diagram drawn in box units: a `width` × `height` figure (`unit` inches a box
    unit), one axes filling it, x from -`left`, y growing downwards, no frame."""
    fig = _new_figure((width * unit, height * unit))
    fig.set_layout_engine("none")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-left, width - left)
    ax.set_ylim(height, 0)
    ax.axis("off")
    return fig, ax


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


