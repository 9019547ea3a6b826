"""ZeRO-3's parameter memory through one step, on one rank (lesson 21).

    fig = zero3_param_memory(memory)   # memory: minitp.course.labs.megatron_or_zero.ParamMemory

Plain data in: ``memory.samples`` (each with ``what``, ``gathered`` and ``shards``
bytes, measured at a unit boundary), ``memory.shards`` and ``memory.unit_bytes``
(each unit's whole padded vector). The shards are drawn at the bottom, the
gathered vectors on top, forward and backward shaded; two dashed lines mark the
shards plus the largest unit, and plus the two largest (a unit and the one
prefetched while it computes).
"""

from __future__ import annotations

from ._style import COMPUTE_COLOR, PHASE_COLORS, _new_figure, _tint, human_bytes


def zero3_param_memory(memory, *, title: str | None = None):
    """Parameter bytes alive on one rank at each unit boundary of a ZeRO-3 step, measured:
    a step plot over the boundaries in the order they happened. Returns the Figure."""
    samples = list(memory.samples)
    if not samples:
        raise ValueError("no samples: record a step inside `with ParamMemory(model):`")
    shards = memory.shards
    largest = sorted(memory.unit_bytes.values(), reverse=True)
    xs = list(range(len(samples)))
    gathered = [s.gathered for s in samples]
    fig = _new_figure((9, 5))
    ax = fig.subplots()
    for phase in ("fwd", "bwd"):  # shade each pass's span
        inside = [i for i, s in enumerate(samples) if s.what.startswith(phase + " ")]
        if inside:
            ax.axvspan(inside[0] - 0.5, inside[-1] + 0.5, color=_tint(PHASE_COLORS[phase], 0.12),
                       label={"fwd": "forward", "bwd": "backward"}[phase], gid=f"span-{phase}")
    ax.fill_between(xs, 0, [shards] * len(xs), step="mid", color=COMPUTE_COLOR,
                    label=f"this rank's shards: {human_bytes(shards)}", gid="fill-shards")
    ax.fill_between(xs, shards, [shards + g for g in gathered], step="mid",
                    color=PHASE_COLORS["fwd"], alpha=0.75,
                    label="gathered parameters (measured)", gid="fill-gathered")
    for k, style in ((1, (0, (4, 3))), (2, (0, (1, 2)))):
        level = shards + sum(largest[:k])
        ax.axhline(level, color="#000000", linewidth=1, linestyle=style,
                   label=f"shards + {'the largest unit' if k == 1 else 'the two largest'}: "
                         f"{human_bytes(level)}", gid=f"line-units-{k}")
    peak = max(range(len(samples)), key=lambda i: samples[i].total)
    ax.annotate(f"peak {human_bytes(samples[peak].total)} ({samples[peak].what})",
                (peak, samples[peak].total), xytext=(0, 10), textcoords="offset points",
                ha="left", fontsize=8, gid="peak")
    begins = [(i, s.what.split()[1]) for i, s in enumerate(samples)
              if s.what.endswith(" begins") or s.what.endswith(" gathered again")]
    ax.set_xticks([i for i, _ in begins], [name for _, name in begins], rotation=60,
                  fontsize=7)
    top = max(s.total for s in samples)
    ax.set(xlim=(-0.5, len(samples) - 0.5), ylim=(0, top * 1.15),
           xlabel="unit boundaries, in order (a tick: the unit's forward begins, or its "
                  "parameters are gathered again for backward)",
           ylabel="bytes on this rank",
           title=title or "ZeRO-3: parameter bytes on one rank through one step (measured)")
    ax.yaxis.set_major_formatter(lambda v, _pos: human_bytes(v))
    fig.legend(frameon=False, fontsize=8, loc="outside lower center", ncol=3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig
