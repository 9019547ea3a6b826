"""A run whose numbers stop being finite stops, at that step, and saves nothing non-finite.

Once a loss is NaN or infinite every later step is too (Adam's update carries it into every
weight), and a run that went on would rotate its good checkpoints out for NaN ones
(--keep) and crash at the end, sampling from NaN probabilities. So each rank stops at the
first step whose loss is not finite: `train_step`'s loss is the same float on every rank
(it is the global batch's), so every rank stops at the same step and no collective is left
waiting. A finite loss is not enough before a save: the step's update, taken after its
loss, can itself make the weights non-finite (an infinite or huge learning rate); so before
each save every rank checks its own weights and optimizer state, and one all-reduce makes
the answer everyone's (`weights_finite`). The parent then prints `Stopped`'s one line and
exits with code 1: the flags were valid (that is exit 2's meaning, refused before any
process starts), the run failed while training.
"""

from __future__ import annotations

import math

import torch


class Stopped(Exception):
    """The run stopped at a step whose numbers were not finite: its message is the one line."""


ADVICE = "(try a smaller --lr, --warmup or --clip-grad)"


def _stopped(saving: bool) -> str:
    return "training stopped there" + (", nothing saved at or after it" if saving else "")


def loss_stop(step: int, loss: float, saving: bool = False) -> str | None:
    """The line that stops the run at `step` (steps taken) when its loss is not finite;
    `saving`: the run writes checkpoints (the line says none was written from there on)."""
    if math.isfinite(loss):
        return None
    return f"step {step}: the loss is {loss} (not finite): {_stopped(saving)} {ADVICE}"


def weights_stop(step: int, loss: float, saving: bool = False) -> str:
    return (f"step {step}: its update made the weights not finite (the step's loss was "
            f"{loss:.4f}): {_stopped(saving)} {ADVICE}")


def eval_stop(step: int, loss: float) -> str:
    return (f"step {step}: the held-out loss is {loss} (not finite): training stopped there, "
            f"before the sample {ADVICE}")


def _local_tensors(model, optimizer):
    """This rank's weights and the optimizer state it steps (a ZeRO or mixed-precision
    optimizer's inner one holds the shards, the masters and their moments)."""
    for p in model.parameters():
        yield p.to_local() if hasattr(p, "to_local") else p  # a DTensor: its shard
    inner = getattr(optimizer, "inner", optimizer)
    for state in inner.state.values():
        yield from (t for t in state.values() if torch.is_tensor(t))
    for group in inner.param_groups:
        yield from group["params"]


def locally_finite(model, optimizer) -> bool:
    """Whether this rank's weights and optimizer state are finite (no collective)."""
    return all(bool(torch.isfinite(t.detach()).all()) for t in _local_tensors(model, optimizer)
               if t.is_floating_point())


def weights_finite(model, optimizer) -> bool:
    """Whether every rank's weights and optimizer state are finite (a collective: every rank
    calls it at the same step)."""
    from ..runtime import comm, trace
    from ..runtime._device import device
    from ..runtime.mesh import Mesh, world

    with trace.paused():  # a check, not part of the step the timeline draws
        flag = torch.tensor([int(locally_finite(model, optimizer))], dtype=torch.int32,
                            device=device())
        mesh = getattr(model, "mesh", None)  # (a trainer's grid beside a generator's)
        axis = mesh.all if isinstance(mesh, Mesh) else world()
        return bool(comm.all_reduce(flag, axis, op="min").item())
