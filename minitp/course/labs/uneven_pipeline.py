"""Lab: a pipeline whose stages do not cost the same, on real ranks (lesson 11).

One launch of 2 ranks runs each layout of `run`'s ``layouts`` (`mt.parallelize`'s
``pipeline_layout``, two stages) in turn: first one float64 SGD step beside one device (the
loss and every weight compared), then, the costs SET by sleep — stage r's forward sleeps
``costs[name][r]`` seconds and its backward twice that (`zero_bubble.unit_costs`, lesson 12's,
with the backward whole) — one more step whose trace MEASURES the step time and the bubble.
What each stage should cost is the caller's model (lesson 11: its share of the training FLOPs).
"""

from __future__ import annotations

import torch

from ...model import GPT
from ...parallelize import parallelize
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...step import train_step
from ..viz.pipeline import pipeline_bubble
from .zero_bubble import unit_costs


def _rank(cfg, layouts, costs, m, batch):
    mesh = Mesh(pp=2)
    batch = tuple(t.to(device()) for t in batch)
    out = {}
    for name, counts in layouts.items():
        torch.manual_seed(0)
        model = parallelize(GPT(cfg).double().to(device()), mesh, pipeline_layout=counts)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = train_step(model, batch, mesh, optimizer, microbatches=m)  # float64; warms up
        weights = model.full_state_dict()
        with unit_costs(model, costs[name][mesh.pp.rank], split=False):
            trace.clear()
            train_step(model, batch, mesh, optimizer, microbatches=m)
        out[name] = loss, weights, [e for e in trace.events() if e.op == "compute"]
    return out


def one_device(cfg, batch):
    """(loss, parameters) of one float64 SGD step (lr 0.1) of GPT(cfg), seeded as the ranks'."""
    torch.manual_seed(0)
    ref = GPT(cfg).double()
    _, loss = ref(*batch)
    loss.backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    return loss.item(), dict(ref.named_parameters())


def run(cfg, layouts: dict, costs: dict, m: int, batch) -> dict:
    """Per layout name: ``step`` (seconds from the first unit to the last, on either rank)
    and ``bubble`` (idle over busy, the mean over the ranks: `mt.viz.pipeline_bubble`), both
    MEASURED with the costs set, and ``error``: the largest difference of the loss and of
    every weight from one device's after one float64 step."""
    ref_loss, ref = one_device(cfg, batch)
    ranks = launch(_rank, 2, cfg, layouts, costs, m, batch, timeout=120)
    out = {}
    for name in layouts:
        loss, weights, _ = ranks[0][name]
        events = [e for rank in ranks for e in rank[name][2]]
        error = max([abs(loss - ref_loss)] + [(weights[n] - q.detach()).abs().max().item()
                                              for n, q in ref.items()])
        out[name] = dict(step=max(e.end for e in events) - min(e.start for e in events),
                         bubble=pipeline_bubble(events), error=error)
    return out
