"""Lesson 18's roofline figure: a GPU's decode, modelled, and this machine's, measured — on
separate panels, so that neither reads as the other's confirmation.

* left, MODEL: a GPU's roofline (attainable FLOP/s = min(peak, intensity · bandwidth)) with
  a decoder's steps at batch 1..1024 placed on it (`mt.calc.inference.serving`);
* middle, MODEL: that decoder's tokens per second against the batch on one GPU, in its own
  units, never scaled onto a measurement;
* right, MEASURED: decode tokens per second here (a CPU, another machine with another
  balance point) at each tp.

Point labels on the roofline are laid out so none covers another: the short-context series
is labelled above-left of its points, the long-context one below-right, and points closer than
`_TOGETHER` in intensity share one label ("B=64, 256, 1024").
"""

from __future__ import annotations

from ... import calc
from ...calc.inference import serving as model_of
from ..viz._style import _new_figure

BATCHES = (1, 4, 16, 64, 256, 1024)
_TOGETHER = 1.5  # points within this factor of intensity share a label: they sit together
# short context above-left of its points (above the slanted roof, empty), long context
# below-right (under it): the two series share their first points, never their labels' side
_PLACES = ({"xytext": (-6, 6), "ha": "right"}, {"xytext": (6, -12), "ha": "left"})


def _groups(xs: list, batches) -> list[tuple[float, list]]:
    """Runs of points closer than `_TOGETHER` in intensity: (the last x, its batches)."""
    groups = []
    for x, b in sorted(zip(xs, batches, strict=True)):
        if groups and x < groups[-1][0] * _TOGETHER:
            groups[-1] = (x, [*groups[-1][1], b])
        else:
            groups.append((x, [b]))
    return groups


def _label(ax, groups, roof, place, series: str):
    for x, batches in groups:
        ax.annotate("B=" + ", ".join(str(b) for b in batches), (x, roof(x)), fontsize=7,
                    textcoords="offset points", gid=f"label-{series}", **place)


def _roofline(ax, shape, cluster, context, batches):
    bw, peak = cluster.memory_bandwidth, cluster.peak_flops

    def roof(x):
        return min(peak, x * bw)

    xs = [2 ** (i / 4) for i in range(-4, 4 * 12)]
    ax.loglog(xs, [roof(x) for x in xs], color="#555555")
    ax.set(xlim=(0.25, xs[-1]), ylim=(peak / 1000, peak * 3))  # room for every label
    ax.axvline(cluster.balance_point, color="#D55E00", lw=1, ls="--")
    ax.text(cluster.balance_point * 1.1, peak / 30, f"balance point\n{cluster.balance_point:.0f} "
            "FLOP/byte", color="#D55E00", fontsize=8, gid="balance")
    for (ctx, marker), place in zip(((1, "o"), (context, "s")), _PLACES, strict=True):
        pts = [model_of.decode_intensity(shape, b, ctx) for b in batches]
        ax.scatter(pts, [roof(x) for x in pts], marker=marker, zorder=3,
                   label=f"decode, {ctx:,} cached position{'s' * (ctx > 1)}")
        _label(ax, _groups(pts, batches), roof, place, f"context{ctx}")
    gpu = cluster.name.split(", ")[-1][3:]
    ax.set(xlabel="arithmetic intensity (FLOPs per byte read)", ylabel="FLOP/s",
           title=f"MODEL: {shape.name} decoding on one {gpu}")
    ax.legend(fontsize=8, loc="lower right")
    return gpu


def roofline(measured: dict, shape=model_of.LLAMA3_8B, cluster=calc.H100_80GB,
             context: int = 4096, batches=BATCHES):
    """The three panels (see the module docstring); ``measured`` is {tp: {batch: tokens/s}}
    from `minitp.course.labs.serving.throughput`."""
    if not measured or not all(measured.values()):
        raise ValueError("measured must hold tokens per second for at least one tp and batch")
    fig = _new_figure((15, 4.2))
    left, middle, right = fig.subplots(1, 3)
    gpu = _roofline(left, shape, cluster, context, batches)
    for ctx, marker in ((1, "o"), (context, "s")):
        rates = [model_of.decode_step_time(shape, cluster, b, ctx).tokens_per_second
                 for b in batches]
        middle.plot(batches, rates, marker=marker, ls="--",
                    label=f"MODEL, {ctx:,} cached position{'s' * (ctx > 1)}")
    middle.set(xscale="log", yscale="log", xlabel="batch (sequences decoding together)",
               ylabel="decode tokens per second (MODEL)",
               title=f"MODEL: {shape.name} on one {gpu}, tp=1")
    middle.legend(fontsize=8)
    for tp, series in measured.items():
        right.plot(list(series), list(series.values()), marker="o",
                   label=f"MEASURED here, tp={tp}")
    right.set(xscale="log", yscale="log", xlabel="batch (sequences decoding together)",
              ylabel="decode tokens per second (MEASURED)",
              title="MEASURED on this CPU: a small Llama-style GPT")
    right.legend(fontsize=8)
    return fig
