"""Lab: time training steps of several models in turn, on every rank of a launch.

Lesson 07 times tensor parallelism, sequence parallelism and recomputation this
way, and `bench/gpu_figures.py` records the same timing on a GPU node; one
function, so that the two measure the same thing.

    times = step_seconds(models, x, y, mesh.tp, rounds=7)   # {name: [seconds, ...]}

Why in turn: a busy moment of a shared machine then lands on every model alike,
rather than on whichever was being timed. Each step starts after a barrier, so
that the ranks start together; on a GPU the timer stops only after the device
has finished (CUDA runs kernels asynchronously, so without the synchronise the
timer would measure only the launching of the kernels).
"""

from __future__ import annotations

import time

from ...runtime import comm, trace
from ...runtime._device import synchronize


def step_seconds(models: dict, x, y, axis, rounds: int) -> dict[str, list[float]]:
    """Forward (`model(x, y)`, which returns ``(logits, loss)``) and backward of each
    model in turn, ``rounds`` times; this rank's seconds for every step, by name.
    The gradients are cleared after each step; nothing is traced."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    times: dict[str, list[float]] = {name: [] for name in models}
    with trace.paused():
        for _ in range(rounds):
            for name, model in models.items():
                comm.barrier(axis)
                synchronize(x.device)
                start = time.perf_counter()
                _, loss = model(x, y)
                loss.backward()
                synchronize(x.device)
                times[name].append(time.perf_counter() - start)
                model.zero_grad(set_to_none=True)
    return times
