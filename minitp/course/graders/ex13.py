"""Checks for ex13: bucketed gradient sync, overlapped with backward.

At dp = 2 and 4, in float64: each rank hooks a small GPT with the learner's
`OverlappedGradSync` and runs two steps; in each, backward on its slice of a
batch with unevenly ignored targets (weighted by its share of the counted
tokens, as `train_step` does), recorded as one trace region, then
``finish()``. Per world size:

* after ``finish()`` every gradient equals the plain model's on the whole
  batch, at both steps (the second shows the object serves step after step);
* each step made exactly one all-reduce per bucket (the bucket rule of the
  exercise), carrying every gradient once, and nothing else;
* the trace shows the overlap: every all-reduce started inside the backward
  region (from a hook, not after it) and was waited for after it (started
  asynchronously, not waited for on the spot, which would stall backward).
"""

from __future__ import annotations

import copy

import torch

from ...model import GPT, GPTConfig
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from .base import Check, run_per_size

WORLD_SIZES = (2, 4)
STEPS = 2
BUCKET_BYTES = 4096  # a handful of buckets for this model (~2k float64 parameters)
CFG = dict(vocab_size=10, seq_len=8, n_layer=2, n_head=2, d_model=8)
TOLERANCE = 1e-12  # float64; the sum is taken in another order than the plain model's


def _expected_buckets(params, bucket_bytes):
    sizes, size = [[]], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if sizes[-1] and size + nbytes > bucket_bytes:
            sizes.append([])
            size = 0
        sizes[-1].append(nbytes)
        size += nbytes
    return [sum(b) for b in sizes]


def _in_rank(sync_class):
    """Runs on every rank: the learner's sync against the plain model's gradients."""
    axis = world()
    cfg = GPTConfig(**CFG)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(device())
    model = copy.deepcopy(ref)
    params = list(model.parameters())
    sync = sync_class(params, axis, BUCKET_BYTES)
    generator = torch.Generator().manual_seed(1)
    steps = []
    for step in range(STEPS):
        x = torch.randint(0, cfg.vocab_size, (2 * axis.size, cfg.seq_len), generator=generator)
        y = torch.randint(0, cfg.vocab_size, (2 * axis.size, cfg.seq_len), generator=generator)
        x, y = x.to(device()), y.to(device())  # drawn on the CPU: the same on every device
        y[step, :5] = -100  # more ignored targets in dp rank 0's slice
        ref.zero_grad()
        model.zero_grad()
        _, loss = ref(x, y)
        loss.backward()
        mine = slice(2 * axis.rank, 2 * axis.rank + 2)  # this rank's contiguous slice
        share = int((y[mine] != -100).sum()) / int((y != -100).sum())  # a float64 weight
        first = len(trace.events())
        _, local = model(x[mine], y[mine])
        with trace.region("backward", "bwd"):
            (local * share).backward()
        sync.finish()
        events = trace.events()[first:]
        backward = next(e for e in events if e.op == "compute" and e.label == "backward")
        comms = [e for e in events if e.is_comm]
        missing = [n for (n, _), p in zip(ref.named_parameters(), params, strict=True)
                   if p.grad is None]
        worst = max(((p.grad - q.grad).abs().max().item(), name)
                    for (name, q), p in zip(ref.named_parameters(), params, strict=True)
                    if p.grad is not None) if not missing else (float("inf"), missing[0])
        steps.append({
            "error": worst, "ops": [e.op for e in comms], "nbytes": [e.nbytes for e in comms],
            "times": [(e.start - backward.start, e.end - backward.start) for e in comms],
            "backward": backward.end - backward.start,
        })
    return {"steps": steps, "expected": _expected_buckets(params, BUCKET_BYTES)}


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.OverlappedGradSync, timeout=20.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="OverlappedGradSync",
                        size="dp")


def _names(n) -> list[str]:
    return [f"dp={n}: gradients equal the plain model's, step after step",
            f"dp={n}: one all-reduce per bucket",
            f"dp={n}: every all-reduce starts during backward, waited for after it"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_equality(names[0], per_rank), _count(names[1], per_rank),
            _overlap(names[2], per_rank)]


def _equality(name, per_rank) -> Check:
    error, step, rank, tensor = max((s["error"][0], k, rank, s["error"][1])
                                    for rank, r in enumerate(per_rank)
                                    for k, s in enumerate(r["steps"]))
    if error <= TOLERANCE:
        return Check(name, True, f"largest error {error:.1e}", max_error=error)
    where = f"step {step + 1}, rank {rank}, {tensor}.grad"
    if error == float("inf"):
        return Check(name, False, f"{where} is None", rank=rank, tensor=tensor,
                     hint="copy each bucket's sum back into the gradients it came from")
    return Check(name, False, f"{where}: largest error {error:.3g}", rank=rank, tensor=tensor,
                 max_error=error, hint="a sum, no division (the loss weighting did it); each "
                 "piece of the sum back into the gradient it came from; and the second step "
                 "starts from a clean slate")


def _count(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            others = sorted({op for op in s["ops"] if op != "all_reduce"})
            if others:
                return Check(name, False, f"step {k + 1}, rank {rank} called "
                             f"{', '.join(others)}", rank=rank,
                             hint="sum with mt.comm.all_reduce_start only, once per bucket")
            if s["nbytes"] != r["expected"]:
                return Check(name, False, f"step {k + 1}, rank {rank} all-reduced (and "
                             f"waited for) {len(s['nbytes'])} tensors of {s['nbytes']} bytes; "
                             f"expected {len(r['expected'])} buckets of {r['expected']} bytes",
                             rank=rank, hint="read the bucket rule in the exercise again; "
                             "every bucket's all-reduce is waited for, at every step")
    buckets = len(per_rank[0]["expected"])
    return Check(name, True, f"{buckets} all-reduces per step, every gradient once")


def _overlap(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            for b, (start, end) in enumerate(s["times"]):
                where = f"step {k + 1}, rank {rank}: all-reduce {b}"
                if not 0 <= start < s["backward"]:
                    when = ("after backward ended" if start >= s["backward"]
                            else "before backward began")
                    return Check(name, False, f"{where} started {when}", rank=rank,
                                 hint="start each bucket's sum from a gradient hook, as soon "
                                      "as its last gradient is in")
                if end < s["backward"]:
                    return Check(name, False, f"{where} was over before backward ended: "
                                 "backward stood still while it ran", rank=rank,
                                 hint="start it with mt.comm.all_reduce_start and wait() for "
                                      "it in finish()")
    leads = [s["backward"] - start for r in per_rank for s in r["steps"] for start, _ in s["times"]]
    return Check(name, True, f"started {max(leads) * 1e3:.1f} to {min(leads) * 1e3:.1f} ms "
                 "before backward ended")
