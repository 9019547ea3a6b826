"""The pictures `python -m minitp.train` writes into a run directory.

Each function takes plain data (lists and dicts of numbers, as in the run's
metrics.json), so it draws a finished run just as well as a live one:

    fig = run_losses(steps, losses, evals)              # loss.png
    fig = run_memory(memory_per_rank)                   # memory.png
    fig = run_wire_bytes(bytes_per_axis)                # comm.png

(The fourth picture, timeline.png, is `mt.viz.timeline`.)
"""

from __future__ import annotations

from ._style import OKABE_ITO, _new_figure

MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations")
MiB = 2**20


def _tidy(ax) -> None:
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def run_losses(steps, losses, evals, *, title: str | None = None):
    """Training loss at every step and held-out loss at each evaluation.

    steps: the step numbers (1-based, as printed); losses: the training loss of
    each; evals: [(step, held-out loss), ...]. Returns the Figure.
    """
    steps, losses = list(steps), list(losses)
    if len(steps) != len(losses):
        raise ValueError(f"{len(steps)} steps but {len(losses)} losses")
    fig = _new_figure((7, 4))
    ax = fig.subplots()
    ax.plot(steps, losses, color=OKABE_ITO[0], label="train", gid="line-train")
    if evals:
        at, values = zip(*evals, strict=True)
        ax.plot(at, values, "o-", color=OKABE_ITO[1], label="held-out", gid="line-held-out")
    ax.set(xlabel="step", ylabel="loss (nats per byte)", title=title or "loss")
    ax.legend(frameon=False)
    _tidy(ax)
    return fig


def run_memory(memory_per_rank, *, kinds=MEMORY_KINDS, title: str | None = None):
    """Memory per rank, stacked by kind: one bar per rank.

    memory_per_rank: one dict per rank, {kind: bytes}: `model_state_bytes`'s
    (minitp.memory) with "activations" added; ``kinds`` stack bottom-up.
    Returns the Figure; each bar segment's gid is "memory-<rank>-<kind>" and its
    height is in MiB.
    """
    if not memory_per_rank:
        raise ValueError("run_memory needs at least one rank")
    fig = _new_figure((7, 4))
    ax = fig.subplots()
    ranks = range(len(memory_per_rank))
    bottom = [0.0] * len(memory_per_rank)
    for color, kind in zip(OKABE_ITO, kinds, strict=False):
        values = [m[kind] / MiB for m in memory_per_rank]
        for rank, (value, low) in enumerate(zip(values, bottom, strict=True)):
            ax.bar(rank, value, bottom=low, color=color, gid=f"memory-{rank}-{kind}",
                   label=kind if rank == 0 else None)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(xlabel="rank", ylabel="MiB", xticks=list(ranks),
           title=title or "memory per rank (activations: one step, every microbatch, as "
                          "saved for backward)")
    ax.legend(frameon=False)
    _tidy(ax)
    return fig


def run_wire_bytes(bytes_per_axis, *, title: str | None = None):
    """Bytes sent per mesh axis ({axis: bytes}, all ranks together), one bar each,
    in MiB, axes in alphabetical order; gid "wire-<axis>". Returns the Figure.

    The trace's wire bytes are the ring MODEL of each traced collective
    (`minitp.config.ring_wire_bytes`), not bytes counted on a network: the
    labels say so."""
    fig = _new_figure((5, 3.5))
    ax = fig.subplots()
    axes = sorted(bytes_per_axis)
    for i, axis in enumerate(axes):
        ax.bar(i, bytes_per_axis[axis] / MiB, color=OKABE_ITO[0], gid=f"wire-{axis}")
    ax.set_xticks(range(len(axes)), axes)
    ax.set(ylabel="MiB sent, all ranks (ring model)",
           title=title or "bytes on the wire per axis, one step")
    _tidy(ax)
    return fig
