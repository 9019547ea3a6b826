"""Lab: PipeDream's asynchronous 1F1B with weight stashing, beside PipeDream-Flush.

PipeDream (Narayanan et al. 2019, SOSP) runs 1F1B *without ever flushing*: the
stream of microbatches never stops, and each stage updates its weights right
after every backward. A microbatch's backward must then use the weights its
forward used, though the stage has updated them since: **weight stashing** keeps
that version until the backward. Stage s of p (from 0) runs p − s − 1 forwards
ahead of its backwards, so at its peak it holds p − s versions: the one every
microbatch in flight used, the newest being the current weights. The update rule
is the paper's, with the stage's weights delayed by p − s − 1 updates::

    W_s ← W_s − η ∇_{W_s} ℓ(W_0^(t−p+1), …, W_s^(t−p+s+1), …, W_{p−1}^(t))

PipeDream-Flush (Narayanan et al. 2021, "Memory-efficient pipeline-parallel DNN
training"; Megatron-LM's and minitp's "1f1b") runs the same order over
m microbatches, then stops (the flush), adds their gradients and takes one
step: synchronous SGD, one version of the weights, a bubble of (p − 1)/m.

Both run here on real processes, one rank per stage, through one executor: the
order is `minitp.pipeline.schedules.one_f_one_b` — over the whole stream for PipeDream,
over each step's m microbatches for the flush. The model is a small stack of
tanh layers (``layers`` per stage, the last one linear) fitting a fixed random
teacher network (mean squared error): a GPT's tied embedding lives on two stages,
which PipeDream would have to keep in step, a question this lab leaves out.

Weights are functional: each version is a tuple of tensors, and an update makes
a new tuple, so a stashed version is simply one that something still holds —
the microbatch in flight and autograd's saved tensors. MEASURED: after every
unit, how many versions are alive (weak references to them) and their bytes; and at
every backward, how far the weights its gradient was computed on lie from the weights
it updates (its staleness: 0 on the last stage and under a flush).

    result = compare(p=3, steps=20, microbatches=4)   # both runs, same data
    result["async"].versions                          # peak live versions per stage
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ...pipeline.schedules import one_f_one_b
from ...rules import unit_label
from ...runtime._device import device
from ...runtime.comm import irecv, isend
from ...runtime.launch import launch
from ...runtime.mesh import world
from ...runtime.trace import region

MODES = ("flush", "async", "async-no-stash")


@dataclass(frozen=True)
class Setup:
    """The experiment: p stages of ``layers`` tanh layers of width ``width``, a stream of
    ``steps`` × ``microbatches`` microbatches of ``rows`` rows, learning rate ``lr``
    (for the mean gradient of a step; PipeDream applies lr/m after each microbatch)."""

    p: int = 3
    steps: int = 20
    microbatches: int = 4
    rows: int = 8
    width: int = 16
    layers: int = 2
    lr: float = 0.5
    seed: int = 0
    dtype: torch.dtype = torch.float64

    @property
    def stream(self) -> int:
        return self.steps * self.microbatches


@dataclass(frozen=True)
class StageRun:
    """What one mode did on every stage (index = stage)."""

    mode: str
    losses: list[float]  # per microbatch of the stream, as the last stage computed it
    versions: list[int]  # MEASURED: the most weight versions alive at once, per stage
    version_bytes: list[int]  # MEASURED: their bytes at that moment
    stage_bytes: list[int]  # one version of the stage's weights
    staleness: list[float]  # MEASURED: mean ‖W_used − W_current‖ / ‖W_current‖ at each backward
    weights: list[list[torch.Tensor]]  # each stage's final weights

    def model_versions(self) -> list[int]:
        """The MODEL: stage s of p keeps p − s versions (1 with a flush)."""
        p = len(self.versions)
        return [1 if self.mode == "flush" else p - s for s in range(p)]


def initial_weights(setup: Setup) -> list[list[torch.Tensor]]:
    """Each stage's (W, b) pairs, flattened: [W0, b0, W1, b1, ...] per stage."""
    g = torch.Generator().manual_seed(setup.seed)
    scale = setup.width ** -0.5
    return [[(torch.randn(setup.width, setup.width, generator=g) * scale if j % 2 == 0
              else torch.zeros(setup.width)).to(setup.dtype)
             for j in range(2 * setup.layers)] for _ in range(setup.p)]


def data(setup: Setup) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The stream: inputs, and the targets a fixed random teacher (a 2-layer tanh
    network) gives them. The same for every mode, so the curves are comparable."""
    g = torch.Generator().manual_seed(setup.seed + 1)
    w = setup.width
    t1, t2 = torch.randn(w, w, generator=g) / w ** 0.5, torch.randn(w, w, generator=g) / w ** 0.5
    xs = [torch.randn(setup.rows, w, generator=g) for _ in range(setup.stream)]
    ys = [torch.tanh(x @ t1) @ t2 for x in xs]
    return [x.to(setup.dtype) for x in xs], [y.to(setup.dtype) for y in ys]


def stage_forward(weights, x, last: bool):
    """One stage: tanh(x Wᵀ + b) per layer; the model's very last layer is linear."""
    pairs = list(zip(weights[0::2], weights[1::2], strict=True))
    for j, (w, b) in enumerate(pairs):
        x = x @ w.T + b  # (rows, width)
        if not (last and j == len(pairs) - 1):
            x = torch.tanh(x)
    return x


def loss_of(out, y):
    return ((out - y) ** 2).mean()


def _order(mode: str, setup: Setup, s: int) -> list[tuple[str, int]]:
    """("F"|"B", microbatch) and ("U", -1) for a flush's update."""
    if mode != "flush":
        return [(kind, i) for kind, _, i in one_f_one_b(setup.p, s, setup.stream)]
    order, m = [], setup.microbatches
    for step in range(setup.steps):
        order += [(kind, step * m + i) for kind, _, i in one_f_one_b(setup.p, s, m)]
        order.append(("U", -1))
    return order


def _refs(tensors) -> tuple:
    return tuple(weakref.ref(t) for t in tensors)


def _distance(used, current) -> float:
    """‖used − current‖ / ‖current‖ over a stage's tensors: how far the weights a gradient
    was computed on lie from the weights it is applied to."""
    gap = sum(float(((u - c) ** 2).sum()) for u, c in zip(used, current, strict=True))
    return (gap / sum(float((c ** 2).sum()) for c in current)) ** 0.5


def _stage(mode: str, setup: Setup, start, xs, ys) -> dict:
    """Rank s runs stage s of the pipeline in `mode`; see the module docstring."""
    axis, dev = world(), device()
    s, p, m = axis.rank, setup.p, setup.microbatches
    first, last = s == 0, s == p - 1

    def version(tensors):  # a new version: leaves that autograd differentiates
        return tuple(t.detach().to(dev).requires_grad_() for t in tensors)

    current = version(start[s])
    made = [_refs(current)]  # weak references to every version: they keep none alive
    in_flight, sends, losses, accumulated, stale = {}, [], {}, None, []
    peak, peak_bytes = 0, 0
    for kind, i in _order(mode, setup, s):
        if kind == "F":
            if first:
                inp = xs[i].to(dev)
            else:
                inp = irecv(torch.empty(setup.rows, setup.width, dtype=setup.dtype, device=dev),
                            axis.ranks[s - 1], tag=2 * i).wait().requires_grad_()
            with region(unit_label("F", i), "fwd"):
                out = stage_forward(current, inp, last)
                if last:
                    out = loss_of(out, ys[i].to(dev))
                    losses[i] = float(out.detach())
            if mode == "async-no-stash":  # keep nothing of the forward but its input
                in_flight[i] = (inp.detach(), out.detach(), None)
            else:  # weight stashing: the version this forward used stays with the microbatch
                in_flight[i] = (inp, out, current)
            if not last:
                sends.append(isend(out, axis.ranks[s + 1], tag=2 * i))
        elif kind == "B":
            inp, out, used = in_flight.pop(i)
            grad = None if last else irecv(torch.empty_like(out), axis.ranks[s + 1],
                                           tag=2 * i + 1).wait()
            with region(unit_label("B", i), "bwd"):
                if used is None:  # the mistake stashing prevents: backward with today's weights
                    used, inp = current, inp.detach().requires_grad_(not first)
                    out = stage_forward(used, inp, last)
                    out = loss_of(out, ys[i].to(dev)) if last else out
                wrt = used + (() if first else (inp,))
                grads = torch.autograd.grad(out, wrt, grad)
            stale.append(_distance(used, current))
            if not first:
                sends.append(isend(grads[-1], axis.ranks[s - 1], tag=2 * i + 1))
            del inp, out, used, wrt  # nothing here keeps a version alive any more
            grads = grads[:len(current)]
            if mode == "flush":
                accumulated = grads if accumulated is None else tuple(
                    a + g for a, g in zip(accumulated, grads, strict=True))
            else:
                current = version(w - setup.lr / m * g for w, g in zip(current, grads,
                                                                         strict=True))
                made.append(_refs(current))
        else:  # the flush's one step, with the mean gradient of the step's m microbatches
            current = version(w - setup.lr / m * g for w, g in zip(current, accumulated,
                                                                     strict=True))
            made.append(_refs(current))
            accumulated = None
        made = [refs for refs in made if refs[0]() is not None]  # the versions still alive
        if len(made) > peak:
            peak = len(made)
            peak_bytes = sum(t.nbytes for refs in made for t in (r() for r in refs)
                             if t is not None)
    for pending in sends:
        pending.wait()
    return {"losses": losses, "versions": peak, "version_bytes": peak_bytes,
            "stage_bytes": sum(t.nbytes for t in current),
            "staleness": sum(stale) / len(stale),
            "weights": [t.detach().cpu() for t in current]}


def run(mode: str, setup: Setup = Setup(), timeout: float = 60.0) -> StageRun:
    """Train ``setup``'s pipeline in ``mode`` ("flush", "async", or "async-no-stash":
    PipeDream without weight stashing) on p real processes."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    xs, ys = data(setup)
    ranks = launch(_stage, setup.p, mode, setup, initial_weights(setup), xs, ys,
                   timeout=timeout)
    losses = ranks[setup.p - 1]["losses"]
    return StageRun(mode, [losses[i] for i in range(setup.stream)],
                    [r["versions"] for r in ranks], [r["version_bytes"] for r in ranks],
                    [r["stage_bytes"] for r in ranks], [r["staleness"] for r in ranks],
                    [r["weights"] for r in ranks])


def compare(setup: Setup = Setup(), timeout: float = 60.0) -> dict[str, StageRun]:
    """PipeDream-Flush and PipeDream (async, weight stashing) on the same stream."""
    return {mode: run(mode, setup, timeout) for mode in ("flush", "async")}


def single_device(setup: Setup = Setup()) -> tuple[list[float], list[torch.Tensor]]:
    """Plain synchronous SGD on one device: the whole stack, each step's mean loss
    over its m microbatches, one step. Returns (loss per microbatch, final weights)."""
    weights = [w.clone().to(device()).requires_grad_() for stage in initial_weights(setup)
               for w in stage]
    xs, ys = data(setup)
    per_stage, losses, m = 2 * setup.layers, [], setup.microbatches
    for step in range(setup.steps):
        total = 0
        for i in range(step * m, (step + 1) * m):
            h = xs[i].to(device())
            for s in range(setup.p):
                h = stage_forward(weights[s * per_stage:(s + 1) * per_stage], h,
                                  s == setup.p - 1)
            loss = loss_of(h, ys[i].to(device()))
            losses.append(float(loss.detach()))
            total = total + loss / m
        grads = torch.autograd.grad(total, weights)
        weights = [(w - setup.lr * g).detach().requires_grad_()
                   for w, g in zip(weights, grads, strict=True)]
    return losses, [w.detach().cpu() for w in weights]
