"""Checks for ex01: ring all-reduce from sendrecv.

At n = 2, 3 and 4 ranks, on tensors whose size n does and does not divide:
the result equals ``torch.distributed.all_reduce`` (called directly, as an
independent reference), the learner's code used only point-to-point messages,
and each rank made exactly 2(n-1) ring steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from .base import Check, run_per_size

WORLD_SIZES = (2, 3, 4)
SHAPES = ((12,), (3, 5), (7,))  # 7 elements: n = 2, 3, 4 do not divide it
TOLERANCE = 1e-12  # float64; the ring only adds, in another order than gloo


def _in_rank(ring_all_reduce):
    """Runs on every rank: the learner's ring against dist.all_reduce, per shape."""
    axis = world()
    found = []
    for index, shape in enumerate(SHAPES):
        generator = torch.Generator().manual_seed(1000 * index + axis.rank)
        x = torch.randn(shape, generator=generator, dtype=torch.float64).to(device())
        expected = x.clone()
        dist.all_reduce(expected)  # the reference, straight from torch.distributed
        first = len(trace.events())
        got = ring_all_reduce(x.clone(), axis)
        ops = [e.op for e in trace.events()[first:]]
        entry = {"shape": shape, "sends": ops.count("send"),
                 "collectives": sorted({op for op in ops if op not in ("send", "recv")})}
        if not isinstance(got, torch.Tensor):
            entry["problem"] = f"returned a {type(got).__name__}, not a tensor"
        elif got.shape != expected.shape:
            entry["problem"] = f"returned shape {tuple(got.shape)}, expected {shape}"
        else:
            entry["error"] = (got.double() - expected).abs().max().item()
        found.append(entry)
    return found


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.ring_all_reduce, timeout=10.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="ring_all_reduce", size="n")


def _names(n) -> list[str]:
    return [f"n={n}: equals dist.all_reduce", f"n={n}: 2(n-1) = {2 * (n - 1)} ring steps"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_equality(names[0], per_rank), _steps(names[1], per_rank, n)]


def _equality(name, per_rank) -> Check:
    worst = None
    for rank, entries in enumerate(per_rank):
        for entry in entries:
            if "problem" in entry:
                detail = f"rank {rank}, input {entry['shape']}: {entry['problem']}"
                return Check(name, False, detail, rank=rank, tensor="result",
                             hint="return a tensor shaped like x: torch.cat(chunks).view_as(x)")
            if worst is None or entry["error"] > worst[0]:
                worst = (entry["error"], rank, entry["shape"])
    error, rank, shape = worst
    if error <= TOLERANCE:
        return Check(name, True, f"largest error {error:.1e}", max_error=error)
    return Check(name, False, f"rank {rank}, input of shape {shape}: largest error {error:.3g}",
                 rank=rank, tensor="result", max_error=error,
                 hint="check which chunk each step sends and which it receives: in the "
                      "reduce-scatter phase add what arrives, in the all-gather phase overwrite")


def _steps(name, per_rank, n) -> Check:
    for rank, entries in enumerate(per_rank):
        for entry in entries:
            if entry["collectives"]:
                used = ", ".join(entry["collectives"])
                return Check(name, False, f"rank {rank} called {used}", rank=rank,
                             hint="build it from mt.comm.sendrecv alone: that is the exercise")
            if entry["sends"] != 2 * (n - 1):
                return Check(name, False, f"rank {rank} sent {entry['sends']} messages "
                             f"for input {entry['shape']}", rank=rank,
                             hint="n-1 steps of reduce-scatter, then n-1 of all-gather, "
                                  "one sendrecv each")
    return Check(name, True, f"every rank sent {2 * (n - 1)} messages")
