"""Checks for ex01: ring all-reduce from sendrecv.

At n = 2, 3 and 4 ranks, on tensors whose size n does and does not divide:
the result equals ``torch.distributed.all_reduce`` (called directly, as an
independent reference), the learner's code used only point-to-point messages,
and each rank made exactly 2(n-1) ring steps.

The exercise does not say which chunk each step sends: this grader's diagnosis does the
teaching. Where a result is wrong it reads, chunk by chunk, whose contributions the
rank's result holds (each rank's input is known, so every partial sum is recognisable):
"holds ranks 0 and 2's parts only (rank 1's is missing)", "holds rank 0's part twice",
or "holds chunk 1's finished sum, not its own".
"""

from __future__ import annotations

import dataclasses
import itertools
import re

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
        inputs = [torch.empty_like(x) for _ in range(axis.size)]
        dist.all_gather(inputs, x)  # every rank's part: to name what a wrong chunk holds
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
            if entry["error"] > TOLERANCE:
                entry["chunks"] = _what_each_chunk_holds(got.double(), inputs, axis.size)
        found.append(entry)
    return found


def _what_each_chunk_holds(got, inputs, n) -> list[str | None]:
    """For each of the n chunks of the flattened result (torch.tensor_split): None where
    it is the full sum, else what it holds, in words."""
    parts = [torch.tensor_split(x.flatten(), n) for x in inputs]
    words = []
    for c, chunk in enumerate(torch.tensor_split(got.flatten(), n)):
        def close(t, chunk=chunk):
            return t.shape == chunk.shape and (t - chunk).abs().max().item() <= TOLERANCE

        if chunk.numel() == 0 or close(sum(p[c] for p in parts)):
            words.append(None)
            continue
        other = [d for d in range(n) if d != c and close(sum(p[d] for p in parts))]
        if other:
            words.append(f"holds chunk {other[0]}'s finished sum, not its own")
            continue
        for weights in itertools.product((0, 1, 2), repeat=n):  # who is in it, how often
            if any(weights) and close(sum(w * p[c] for w, p in zip(weights, parts, strict=True))):
                words.append(_contributions(weights))
                break
        else:
            words.append("is no sum of the ranks' parts of this chunk (values from another "
                         "chunk, or a buffer never filled?)")
    return words


def _contributions(weights) -> str:
    def ranks(rs):
        return "rank " + str(rs[0]) if len(rs) == 1 else (
            "ranks " + ", ".join(map(str, rs[:-1])) + " and " + str(rs[-1]))

    twice = [r for r, w in enumerate(weights) if w == 2]
    missing = [r for r, w in enumerate(weights) if w == 0]
    held = [r for r, w in enumerate(weights) if w]
    if twice:
        return f"holds {ranks(twice)}'s part twice"
    return f"holds {ranks(held)}'s parts only ({ranks(missing)}'s missing)"


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.ring_all_reduce, timeout=10.0)

    checks = run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="ring_all_reduce",
                          size="n")
    return [_sizes_disagreed(c) if SIZE_MISMATCH.search(c.detail) else c for c in checks]


# gloo's words when a message does not fit the buffer posted for it (bytes sent vs room)
SIZE_MISMATCH = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")


def _sizes_disagreed(check: Check) -> Check:
    """A crash that is a ring mistake: neighbours disagreed on which chunk travels."""
    sent, room = SIZE_MISMATCH.search(check.detail).groups()
    rank = f"rank {check.rank}" if check.rank is not None else "a rank"
    return dataclasses.replace(
        check, detail=f"{rank} was sent {sent} bytes into a buffer of {room}: at one step two "
                      "neighbours disagreed on which chunk travels (chunks differ in size when "
                      "n does not divide x.numel())",
        hint="the chunk a rank receives at step s is the chunk its left neighbour (axis.prev) "
             "sends at step s: work out both from the same rule")


def _names(n) -> list[str]:
    return [f"n={n}: equals dist.all_reduce", f"n={n}: 2(n-1) = {2 * (n - 1)} ring steps"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_equality(names[0], per_rank), _steps(names[1], per_rank, n)]


def _equality(name, per_rank) -> Check:
    results = []  # (error, rank, shape, what each chunk holds), rank by rank, input by input
    for rank, entries in enumerate(per_rank):
        for entry in entries:
            if "problem" in entry:
                detail = f"rank {rank}, input {entry['shape']}: {entry['problem']}"
                return Check(name, False, detail, rank=rank, tensor="result",
                             hint="return a tensor shaped like x: torch.cat(chunks).view_as(x)")
            results.append((entry["error"], rank, entry["shape"], entry.get("chunks")))
    failing = [r for r in results if r[0] > TOLERANCE]
    if not failing:
        error = max(r[0] for r in results)
        return Check(name, True, f"largest error {error:.1e}", max_error=error)
    error, rank, shape, chunks = failing[0]  # the first one: its chunks tell the story
    detail = f"rank {rank}, input of shape {shape}: largest error {error:.3g}"
    wrong = [(c, words) for c, words in enumerate(chunks or []) if words]
    if wrong:
        detail += "; " + "; ".join(f"chunk {c} of {len(chunks)} {words}" for c, words in wrong)
    return Check(name, False, detail, rank=rank, tensor="result", max_error=error,
                 hint="reduce-scatter: each chunk must travel once around the ring, every rank "
                      "adding its own part as it passes, so that after n-1 steps each rank "
                      "holds one chunk's finished sum; all-gather: the finished chunks travel "
                      "on, overwritten, not added")


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
