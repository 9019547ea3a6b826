"""The pictures `python -m minitp.train` writes into a run directory.

Each function takes plain data (lists and dicts of numbers, as in the run's
metrics.json), so it draws a finished run just as well as a live one:

    fig = run_losses(steps, losses, evals, reference=ref)  # loss.png
    fig = run_memory(memory_per_rank)                   # memory.png
    fig = run_wire_bytes(model_bytes, measured=sent)    # comm.png

(The fourth picture, timeline.png, is `mt.viz.timeline`.)
"""

from __future__ import annotations

from ._style import OKABE_ITO, _new_figure, human_bytes

MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations")
MiB = 2**20


def _tidy(ax) -> None:
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def run_losses(steps, losses, evals, *, reference=None, title: str | None = None):
    """Training loss at every step and held-out loss at each evaluation.

    steps: the step numbers (1-based, as printed); losses: the training loss of
    each; evals: [(step, held-out loss), ...]; reference: the single-process
    GPT's training loss at the same steps (``--check``), drawn dashed over the
    parallel run's curve. Returns the Figure.
    """
    steps, losses = list(steps), list(losses)
    if len(steps) != len(losses):
        raise ValueError(f"{len(steps)} steps but {len(losses)} losses")
    if reference is not None and len(list(reference)) != len(steps):
        raise ValueError(f"{len(steps)} steps but {len(list(reference))} reference losses")
    fig = _new_figure((7, 4))
    ax = fig.subplots()
    ax.plot(steps, losses, color=OKABE_ITO[0], label="train (parallel run)", gid="line-train")
    if reference is not None:
        diff = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
        ax.plot(steps, list(reference), "--", color=OKABE_ITO[2], linewidth=1.2,
                label=f"train, one process (--check): largest difference {diff:.2g}",
                gid="line-reference")
    if evals:
        at, values = zip(*evals, strict=True)
        ax.plot(at, values, "o-", color=OKABE_ITO[1], label="held-out", gid="line-held-out")
    ax.set(xlabel="step", ylabel="loss (nats per byte)", title=title or "loss")
    ax.legend(frameon=False, loc="upper right")
    _tidy(ax)
    return fig


def run_memory(memory_per_rank, *, kinds=MEMORY_KINDS, title: str | None = None):
    """Memory per rank, stacked by kind: one bar per rank.

    memory_per_rank: one dict per rank, {kind: bytes}: `measure_model_states`'s
    (minitp.memory) with "activations" added; ``kinds`` stack bottom-up.
    Returns the Figure; each bar segment's gid is "memory-<rank>-<kind>" and its
    height is in MiB. The legend sits outside the axes, right of the bars, so it
    covers none of them however many ranks there are.
    """
    if not memory_per_rank:
        raise ValueError("run_memory needs at least one rank")
    fig = _new_figure((8, 4))
    ax = fig.subplots()
    ranks = range(len(memory_per_rank))
    bottom = [0.0] * len(memory_per_rank)
    for color, kind in zip(OKABE_ITO, kinds, strict=False):
        values = [m[kind] / MiB for m in memory_per_rank]
        for rank, (value, low) in enumerate(zip(values, bottom, strict=True)):
            ax.bar(rank, value, bottom=low, color=color, gid=f"memory-{rank}-{kind}",
                   label=kind if rank == 0 else None)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(xlabel="rank", ylabel="MiB (measured, per rank)", xticks=list(ranks))
    ax.set_title(title or "memory per rank (activations: one step, every microbatch, as "
                          "saved for backward)", fontsize=10)
    # Reversed, so the legend reads top-down in the order the segments stack.
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], frameon=False, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    _tidy(ax)
    return fig


# What each axis of a run's trace carries, in one line: the picture's y labels.
AXIS_ROLES = {
    "tp": "tensor parallel: every layer's all-reduces\n(all-gathers and reduce-scatters "
          "with SP)",
    "p2p": "pipeline: activations sent forward,\ntheir gradients back (send/recv)",
    "cp": "context parallelism: keys and values\naround the ring (send/recv)",
    "dp": "data parallel: the gradients' all-reduce\n(and the loss, one number)",
    "embedding": "tied embedding: its gradient summed\nbetween the first and last stage",
    "pp": "the loss, summed over the stages so every\nrank can print it (one number)",
    "world": "every rank",
}


def run_wire_bytes(bytes_per_axis, *, measured=None, title: str | None = None):
    """Bytes sent per mesh axis in one step, all ranks together: one horizontal bar
    per axis (gid "wire-<axis>", width in MiB), each labelled with its size and
    with what the axis carries (`AXIS_ROLES`), axes in alphabetical order from
    the top.

    bytes_per_axis: {axis: bytes} under the ring MODEL (`Event.model_bytes`);
    measured: {axis: bytes the processes wrote to their sockets} (`Event.sent_bytes`,
    None for an axis where some op could not be measured), drawn as a second
    bar (gid "measured-<axis>") beside the model's. Sizes span 64 B (a loss)
    to MiBs (gradients), so each bar carries its own number. Returns the Figure.
    """
    axes = sorted(bytes_per_axis)
    fig = _new_figure((8, 0.9 + 0.75 * max(1, len(axes))))
    ax = fig.subplots()
    height = 0.38 if measured else 0.6
    top = max([bytes_per_axis[a] for a in axes] + [v for v in (measured or {}).values() if v]
              + [1]) / MiB
    labelled: set[str] = set()  # legend entries already drawn
    for i, axis in enumerate(axes):
        bars = [("ring model", bytes_per_axis[axis], OKABE_ITO[0], "wire")]
        if measured:
            bars.append(("measured (bytes written to sockets)", measured.get(axis),
                         OKABE_ITO[1], "measured"))
        for k, (what, value, color, gid) in enumerate(bars):
            y = i + (k - (len(bars) - 1) / 2) * height
            if value is None:
                # An op of this axis overlapped another in its process (the
                # per-process counter cannot split them), or nothing counts (NCCL, macOS).
                ax.text(0, y, "  measured: none (ops overlapped, or no counter)", va="center",
                        fontsize=8, color="#555555")
                continue
            ax.barh(y, value / MiB, height=height * 0.9, color=color, gid=f"{gid}-{axis}",
                    label=None if what in labelled else what)
            labelled.add(what)
            ax.text(value / MiB + 0.01 * top, y, human_bytes(value), va="center", fontsize=8)
    ax.set_yticks(range(len(axes)),
                  [f"{a}: {AXIS_ROLES[a]}" if a in AXIS_ROLES else a for a in axes],
                  fontsize=8)
    ax.set_ylim(len(axes) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.18)
    what = "ring model and measured" if measured else "ring model: what the ring algorithm sends"
    ax.set_xlabel(f"MiB sent in one step, all ranks together ({what})")
    ax.set_title(title or "bytes on the wire per axis, one step", fontsize=10, loc="left")
    if measured:
        ax.legend(frameon=False, loc="lower right", fontsize=8)
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig
