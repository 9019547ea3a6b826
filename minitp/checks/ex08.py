"""Checks for ex08: bucketed gradient sync.

At dp = 2 and 4, in float64: each rank runs a small GPT's backward on its slice
of a batch with unevenly ignored targets, weighted by its share of the counted
tokens; after the learner's `bucketed_sync` every gradient equals the plain
model's on the whole batch, and the learner made exactly one all-reduce per
bucket (the bucket rule of the exercise), carrying every gradient once.
"""

from __future__ import annotations

import copy

import torch

from minitp import trace
from minitp.launch import launch
from minitp.mesh import world
from minitp.model import GPT, GPTConfig

from .base import Check, run_per_size

WORLD_SIZES = (2, 4)
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


def _in_rank(bucketed_sync):
    """Runs on every rank: the learner's sync against the plain model's gradients."""
    axis = world()
    cfg = GPTConfig(**CFG)
    torch.manual_seed(0)
    ref = GPT(cfg).double()
    model = copy.deepcopy(ref)
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (2 * axis.size, cfg.seq_len), generator=generator)
    y = torch.randint(0, cfg.vocab_size, (2 * axis.size, cfg.seq_len), generator=generator)
    y[0, :5] = -100  # more ignored targets in dp rank 0's slice
    _, loss = ref(x, y)
    loss.backward()
    mine = slice(2 * axis.rank, 2 * axis.rank + 2)  # this rank's contiguous slice
    share = int((y[mine] != -100).sum()) / int((y != -100).sum())  # a float64 weight
    _, local = model(x[mine], y[mine])
    (local * share).backward()
    params = list(model.parameters())
    first = len(trace.events())
    bucketed_sync(params, axis, BUCKET_BYTES)
    events = trace.events()[first:]
    worst = max(((p.grad - q.grad).abs().max().item(), name)
                for (name, q), p in zip(ref.named_parameters(), params, strict=True))
    return {"error": worst, "ops": [e.op for e in events], "nbytes": [e.nbytes for e in events],
            "expected": _expected_buckets(params, BUCKET_BYTES)}


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.bucketed_sync, timeout=20.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="bucketed_sync", size="dp")


def _names(n) -> list[str]:
    return [f"dp={n}: gradients equal the plain model's", f"dp={n}: one all-reduce per bucket"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_equality(names[0], per_rank), _count(names[1], per_rank)]


def _equality(name, per_rank) -> Check:
    error, rank, tensor = max((r["error"][0], rank, r["error"][1])
                              for rank, r in enumerate(per_rank))
    if error <= TOLERANCE:
        return Check(name, True, f"largest error {error:.1e}", max_error=error)
    return Check(name, False, f"rank {rank}, {tensor}.grad: largest error {error:.3g}",
                 rank=rank, tensor=tensor, max_error=error,
                 hint="all-reduce with a sum (no division: the loss weighting already did it) "
                      "and copy each bucket's pieces back into the gradients they came from")


def _count(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        others = sorted({op for op in r["ops"] if op != "all_reduce"})
        if others:
            return Check(name, False, f"rank {rank} called {', '.join(others)}", rank=rank,
                         hint="use mt.comm.all_reduce only, once per bucket")
        if r["nbytes"] != r["expected"]:
            return Check(name, False, f"rank {rank} all-reduced {len(r['nbytes'])} tensors of "
                         f"{r['nbytes']} bytes; expected {len(r['expected'])} buckets of "
                         f"{r['expected']} bytes", rank=rank,
                         hint="fill buckets in reversed(params) order; open a new one when the "
                              "current bucket is non-empty and this gradient would take it "
                              "over bucket_bytes")
    buckets = len(per_rank[0]["expected"])
    return Check(name, True, f"{buckets} all-reduces, every gradient once")
