"""Measurements of sharded checkpoints on real ranks, for the lesson "When a rank dies":

* `write_example`: train a few steps at one layout and save (who writes what: the manifest);
* `bytes_read_per_rank`: load it at another layout; the bytes each rank read, beside
  the dense load's (every rank reads every byte);
* `save_timing`: step times with no save, a synchronous save and an asynchronous one,
  and the trace that shows them (snapshot and write events).

The kill-and-restart run is `minitp.train.restart.kill_and_restart` (it runs the CLI).
"""

from __future__ import annotations

import json
import os

import torch

from ..runtime import trace
from ..runtime._device import device

TINY = dict(vocab_size=256, seq_len=16, n_layer=2, n_head=4, d_model=32)


def _build(cfg: dict, sizes, zero_stage: int):
    from ..data_parallel.zero import make_optimizer
    from ..model import GPT, GPTConfig
    from ..parallelize import parallelize
    from ..runtime.mesh import Mesh

    dp, pp, tp = sizes
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    torch.manual_seed(0)
    model = parallelize(GPT(GPTConfig(**cfg)).to(device()), mesh, zero_stage=zero_stage)
    optimizer = make_optimizer(model, mesh, lambda ts: torch.optim.Adam(ts, lr=1e-3))
    return mesh, model, optimizer


def _batch(cfg: dict, step: int, batch_size: int = 8):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, cfg["vocab_size"], (batch_size, cfg["seq_len"]), generator=g)
    return x.to(device()), torch.roll(x, -1, dims=1).to(device())


def _train_and_save(cfg, sizes, zero_stage, directory, steps):
    from ..step import train_step
    from .sharded import Saver

    mesh, model, optimizer = _build(cfg, sizes, zero_stage)
    with trace.paused():
        for step in range(steps):
            train_step(model, _batch(cfg, step), mesh, optimizer, microbatches=2)
        saver = Saver(model, optimizer, mesh, directory, dict(zero_stage=zero_stage))
        saver.save(steps)
        saver.close()


def write_example(directory: str, dp: int = 2, pp: int = 1, tp: int = 2, zero_stage: int = 1,
                  cfg: dict | None = None, steps: int = 1) -> dict:
    """Train `steps` steps at (dp, pp, tp, ZeRO stage) and save: returns the manifest of
    ``directory/step-<steps>`` (its "files": what each rank wrote)."""
    from ..runtime.launch import launch

    launch(_train_and_save, dp * pp * tp, cfg or TINY, (dp, pp, tp), zero_stage, directory,
           steps, backend="gloo", timeout=120)
    with open(os.path.join(directory, f"step-{steps}", "manifest.json")) as f:
        return json.load(f)


def _load(step_dir, sizes, zero_stage):
    from .sharded_read import load

    dp, pp, tp = sizes
    from ..runtime.mesh import Mesh

    _, _, meta = load(step_dir, Mesh(dp=dp, pp=pp, tp=tp), zero_stage=zero_stage,
                      optimizer_factory=lambda ts: torch.optim.Adam(ts, lr=1e-3))
    return meta["bytes_read"]


def bytes_read_per_rank(step_dir: str, dp: int = 4, pp: int = 1, tp: int = 1,
                        zero_stage: int = 0) -> dict:
    """Load a sharded checkpoint at (dp, pp, tp, ZeRO stage): {"per_rank": bytes each rank
    read (measured: the sum of its reads), "dense": what each rank reads in a dense load
    (every byte of the model and Adam's state: the files' total)}."""
    from ..runtime.launch import launch

    with open(os.path.join(step_dir, "manifest.json")) as f:
        dense = sum(entry["bytes"] for entry in json.load(f)["files"].values())
    run = launch(_load, dp * pp * tp, step_dir, (dp, pp, tp), zero_stage, backend="gloo",
                 timeout=120)
    return {"per_rank": list(run), "dense": dense}


def _timed_steps(cfg, sizes, zero_stage, directory, steps, every):
    from ..step import train_step
    from .sharded import Saver

    mesh, model, optimizer = _build(cfg, sizes, zero_stage)
    rec = trace.recorder()
    out = {}
    for mode in ("none", "sync", "async"):
        saver = None
        if mode != "none":
            saver = Saver(model, optimizer, mesh, os.path.join(directory, mode),
                          dict(zero_stage=zero_stage), asynchronous=mode == "async")
        spans = []
        for step in range(1, steps + 1):
            start = rec.now()
            with trace.paused():
                train_step(model, _batch(cfg, step), mesh, optimizer, microbatches=2)
            if saver is not None and step % every == 0:
                saver.save(step)
            spans.append((start, rec.now()))
        if saver is not None:
            saver.close()
        out[mode] = spans
    return out


TIMING = dict(TINY, n_layer=4, d_model=256)  # ~39 MB of model and Adam state: writes to see


def save_timing(directory: str, dp: int = 2, pp: int = 1, tp: int = 1, zero_stage: int = 1,
                cfg: dict | None = None, steps: int = 6, every: int = 2) -> dict:
    """The same run three times over (in the same processes): no save, a synchronous save
    every `every` steps, an asynchronous one. Returns {"step_seconds": {mode: [rank 0's
    step times]}, "spans": {mode: [(start, end)] of rank 0's steps}, "events": the
    checkpoint events of every rank ("checkpoint: snapshot", "checkpoint: write"), on the
    launch's clock}. Measured on this machine: the numbers are its own."""
    from ..runtime.launch import launch

    run = launch(_timed_steps, dp * pp * tp, cfg or TIMING,
                 (dp, pp, tp), zero_stage, directory, steps, every, backend="gloo",
                 timeout=120)
    spans = run[0]
    return {"step_seconds": {m: [b - a for a, b in s] for m, s in spans.items()},
            "spans": spans,
            "events": [e for e in run.trace if e.label.startswith("checkpoint: ")]}
