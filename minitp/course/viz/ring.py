"""Context parallelism's pictures (lesson 08): the ring drawn from a run's trace,
the causal work each rank did, and activation memory against sequence length.

    fig = ring(run.trace)              # every send of the run's cp ring
    fig = causal_work(work)            # work: mt.labs.long_sequences.ring_work(...)
    fig = memory_vs_length(rows)       # rows: mt.labs.long_sequences.memory_vs_length(...)

Plain data in: the trace's events with axis "cp" and op "send" (the sender's
record: its global rank, the peer it sent to, when it started and ended, the
label the ring gave it). Two panels:

* left, the ring: ranks on a circle, one arrow per (sender, receiver) pair that
  the trace holds, labelled with how many messages and bytes went that way;
* right, the sends as a rank × step grid: one row per rank, one cell per send in
  the order the rank made them, saying whom it went to, coloured by what it
  carried (its label's last part: "ring K/V", "ring dK/dV"); the forward and
  backward columns shaded. When each send happened is the timeline's job
  (`viz.timeline`): this grid shows the ring's pattern at a glance.
"""

from __future__ import annotations

import math

from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import NullFormatter

from ._style import OKABE_ITO, PHASE_COLORS, _new_figure, _tint, human_bytes, rank_color


def ring_sends(events, axis: str = "cp") -> list:
    """The sends a ring over `axis` made (`minitp.runtime.comm.isend(..., via=axis)`), in time
    order; "p2p" for sends made without naming a ring (the pipeline's, or your own)."""
    sends = [e for e in events if e.axis == axis and e.op == "send" and e.peer is not None]
    return sorted(sends, key=lambda e: (e.start, e.rank))


def _kind(label: str) -> str:
    return label.rsplit(".", 1)[-1] if label else "send"


def ring(events, *, axis: str = "cp", title: str | None = None):
    """The ring's messages, from a trace (`run.trace`): who sent to whom, how much,
    and when. Returns the Figure."""
    sends = ring_sends(events, axis)
    if not sends:
        raise ValueError(f"no sends of a ring over {axis!r} in this trace (axis {axis!r}, "
                         "op 'send')")
    ranks = sorted({e.rank for e in sends} | {e.peer for e in sends})
    kinds = list(dict.fromkeys(_kind(e.label) for e in sends))
    colors = {k: OKABE_ITO[(i + 1) % len(OKABE_ITO)] for i, k in enumerate(kinds)}
    fig = _new_figure((11, 4.6))
    left, right = fig.subplots(1, 2, width_ratios=(1, 2.2))

    # the ring: ranks on a circle, clockwise from the top
    where = {r: (math.sin(2 * math.pi * i / len(ranks)), math.cos(2 * math.pi * i / len(ranks)))
             for i, r in enumerate(ranks)}
    pairs: dict[tuple[int, int], list] = {}
    for e in sends:
        pairs.setdefault((e.rank, e.peer), []).append(e)
    for (src, dst), these in pairs.items():
        (x0, y0), (x1, y1) = where[src], where[dst]
        left.annotate("", (x1 * 0.8, y1 * 0.8), (x0 * 0.8, y0 * 0.8),
                      arrowprops={"arrowstyle": "-|>,head_width=0.4,head_length=0.8",
                                  "color": rank_color(src), "lw": 2, "shrinkA": 16,
                                  "shrinkB": 16, "connectionstyle": "arc3,rad=-0.25"},
                      gid=f"pair-{src}-{dst}")
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        norm = math.hypot(mx, my) or 1.0
        left.text(mx / norm * 0.95, my / norm * 0.95,
                  f"{len(these)} msgs\n{human_bytes(sum(e.nbytes for e in these))}",
                  ha="center", va="center", fontsize=7)
    for r, (x, y) in where.items():
        left.scatter([x * 0.8], [y * 0.8], s=700, color=_tint(rank_color(r), 0.6),
                     edgecolor=rank_color(r), zorder=3)
        left.text(x * 0.8, y * 0.8, f"rank {r}", ha="center", va="center", fontsize=8, zorder=4)
    left.set(xlim=(-1.35, 1.35), ylim=(-1.35, 1.35), aspect="equal",
             title="who sends to whom (from the trace)")
    left.axis("off")

    # the sends as a grid: one row per rank, one column per ring step (each rank's sends
    # in the order it made them), so the ring reads across, not as crossing arrows
    lane = {r: i for i, r in enumerate(ranks)}
    by_rank: dict[int, list] = {}
    for e in sends:
        by_rank.setdefault(e.rank, []).append(e)
    width = max(len(these) for these in by_rank.values())
    for phase in ("fwd", "bwd"):  # shade the columns each pass's sends took (rank 0's order)
        columns = [i for i, e in enumerate(by_rank[ranks[0]]) if e.phase == phase]
        if columns:
            right.axvspan(min(columns) - 0.05, max(columns) + 0.95,
                          color=_tint(PHASE_COLORS[phase], 0.12), gid=f"span-{phase}",
                          label={"fwd": "forward", "bwd": "backward"}[phase])
    for rank, these in by_rank.items():
        for step, e in enumerate(these):
            color = colors[_kind(e.label)]
            right.add_patch(Rectangle((step, lane[rank] - 0.4), 0.9, 0.8,
                                      facecolor=_tint(color, 0.45), edgecolor=color,
                                      linewidth=0.8, gid="cell"))
            right.text(step + 0.45, lane[rank], f"→{e.peer}", ha="center", va="center",
                       fontsize=7 if width <= 24 else 5.5, gid="send")
    for k in kinds:
        right.plot([], [], color=colors[k], label=k)
    right.set(xlim=(-0.2, width + 0.1), ylim=(len(ranks) - 0.5, -0.5),
              yticks=range(len(ranks)), yticklabels=[f"rank {r}" for r in ranks],
              xlabel="ring step: each rank's sends in the order it made them (→ the receiver)",
              title=f"{len(sends)} sends, rank by step (from the trace)")
    fig.legend(*right.get_legend_handles_labels(), frameon=False, fontsize=8,
               loc="outside lower center", ncol=2 + len(kinds))
    for side in ("top", "right"):
        right.spines[side].set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def causal_work(work, *, title: str | None = None):
    """Per split ("contiguous", "load-balanced"): which blocks of the causal mask each
    rank computed (the chunk grid, coloured by the rank that holds the query chunk),
    and the query·key scores each rank computed, measured. `work`: {split: [per rank
    {"chunks", "scores", ...}]}. Returns the Figure."""
    splits = list(work)
    cp = len(work[splits[0]])
    n = 2 * cp
    fig = _new_figure((4 * len(splits) + 4.5, 4))
    axes = fig.subplots(1, len(splits) + 1, width_ratios=[1] * len(splits) + [1.3])
    for ax, split in zip(axes, splits, strict=False):
        owner = {c: r for r, w in enumerate(work[split]) for c in w["chunks"]}
        for qc in range(n):
            for kc in range(qc + 1):
                r = owner[qc]
                ax.add_patch(_cell((kc, qc), 1, 1, _tint(rank_color(r), 0.7),
                                                  rank_color(r), triangle=kc == qc))
        ax.set(xlim=(0, n), ylim=(n, 0), aspect="equal", xticks=range(n), yticks=range(n),
               xlabel="key chunk", ylabel="query chunk", title=f"{split}: who computes what")
        ax.tick_params(labelsize=7)
    axes[0].legend(handles=[Patch(facecolor=_tint(rank_color(r), 0.7), edgecolor=rank_color(r),
                                  label=f"rank {r}") for r in range(cp)],
                   frameon=False, fontsize=7, loc="upper right")
    bars = axes[-1]
    width = 0.8 / len(splits)
    for i, split in enumerate(splits):
        scores = [w["scores"] for w in work[split]]
        xs = [r + (i - (len(splits) - 1) / 2) * width for r in range(cp)]
        bars.bar(xs, scores, width, color=OKABE_ITO[i * 5 % len(OKABE_ITO)],
                 hatch="" if i == 0 else "//", edgecolor="white", label=split,
                 gid=f"bars-{split}")
        bars.axhline(max(scores), color=OKABE_ITO[i * 5 % len(OKABE_ITO)], lw=0.8,
                     linestyle=(0, (4, 3)))
    bars.set(xticks=range(cp), xticklabels=[f"rank {r}" for r in range(cp)],
             ylabel="query·key scores computed (measured)",
             title="work per rank (dashed: the slowest sets the pace)")
    bars.legend(frameon=False, fontsize=8)
    for side in ("top", "right"):
        bars.spines[side].set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def _cell(xy, w, h, face, edge, triangle=False):
    """A cell of the chunk grid: a square, or its lower-left triangle (a causal block)."""
    from matplotlib.patches import Polygon, Rectangle

    if triangle:
        x, y = xy
        return Polygon([(x, y), (x, y + h), (x + w, y + h)], closed=True, facecolor=face,
                       edgecolor=edge)
    return Rectangle(xy, w, h, facecolor=face, edgecolor=edge)


def memory_vs_length(rows, *, title: str | None = None):
    """Activation bytes per layer on one rank against sequence length, one line per
    setting: measured (solid, dots) and its model (dashed, labelled "model"). `rows`:
    objects with setting, seq_len, measured, model. Returns the Figure."""
    settings = list(dict.fromkeys(r.setting for r in rows))
    fig = _new_figure((7.5, 4.5))
    ax = fig.subplots()
    for i, setting in enumerate(settings):
        these = sorted((r for r in rows if r.setting == setting), key=lambda r: r.seq_len)
        color = OKABE_ITO[(2 * i) % len(OKABE_ITO)]
        xs = [r.seq_len for r in these]
        ax.plot(xs, [r.measured for r in these], "o-", color=color,
                label=f"{setting} (measured)", gid=f"measured-{setting}")
        ax.plot(xs, [r.model for r in these], linestyle=(0, (4, 3)), color=color,
                label=f"{setting} (model)", gid=f"model-{setting}")
    ax.set(xlabel="sequence length s (tokens)", ylabel="activation bytes per layer, one rank",
           title=title or "activation memory against sequence length")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)  # a tick per doubling: memory that grows as s reads as a line
    lengths = sorted({r.seq_len for r in rows})
    ax.set_xticks(lengths, [str(s) for s in lengths])
    ax.yaxis.set_major_formatter(lambda v, _pos: human_bytes(v))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(frameon=False, fontsize=8, ncol=2)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig
