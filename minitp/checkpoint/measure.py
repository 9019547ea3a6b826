"""Measurements of sharded checkpoints on real ranks, for the lesson "When a rank dies":

* `write_example`: train a few steps at one layout and save (who writes what: the manifest);
* `bytes_read_per_rank`: load it at another layout; the bytes each rank read, beside
  the dense load's (every rank reads every byte);
* `save_timing`: step times with no save, a synchronous save and an asynchronous one,
  and the trace that shows them (snapshot and write events);
* `kill_and_restart`: a torchrun job whose rank is SIGKILLed mid-run, restarted, and
  resumed, beside the same job never interrupted: loss curves and final parameters.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import torch

from ..runtime import trace

TINY = dict(vocab_size=256, seq_len=16, n_layer=2, n_head=4, d_model=32)


def _build(cfg: dict, sizes, zero_stage: int):
    from .. import GPT, GPTConfig, Mesh, make_optimizer, parallelize

    dp, pp, tp = sizes
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    torch.manual_seed(0)
    model = parallelize(GPT(GPTConfig(**cfg)), mesh, zero_stage=zero_stage)
    optimizer = make_optimizer(model, mesh, lambda ts: torch.optim.Adam(ts, lr=1e-3))
    return mesh, model, optimizer


def _batch(cfg: dict, step: int, batch_size: int = 8):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, cfg["vocab_size"], (batch_size, cfg["seq_len"]), generator=g)
    return x, torch.roll(x, -1, dims=1)


def _train_and_save(cfg, sizes, zero_stage, directory, steps):
    from .. import train_step
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
    from .reshard import load

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
    from .. import train_step
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


def save_timing(directory: str, dp: int = 2, pp: int = 1, tp: int = 2, zero_stage: int = 1,
                cfg: dict | None = None, steps: int = 6, every: int = 2) -> dict:
    """The same run three times over (in the same processes): no save, a synchronous save
    every `every` steps, an asynchronous one. Returns {"step_seconds": {mode: [rank 0's
    step times]}, "spans": {mode: [(start, end)] of rank 0's steps}, "events": the
    checkpoint events of every rank ("checkpoint: snapshot", "checkpoint: write"), on the
    launch's clock}. Measured on this machine: the numbers are its own."""
    from ..runtime.launch import launch

    run = launch(_timed_steps, dp * pp * tp, cfg or dict(TINY, d_model=128, n_layer=4),
                 (dp, pp, tp), zero_stage, directory, steps, every, backend="gloo",
                 timeout=120)
    spans = run[0]
    return {"step_seconds": {m: [b - a for a, b in s] for m, s in spans.items()},
            "spans": spans,
            "events": [e for e in run.trace if e.label.startswith("checkpoint: ")]}


def _torchrun(folder, flags, world, env, timeout) -> tuple[int, str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world), "--max-restarts", "1", "--monitor-interval",
               "0.1", "-m", "minitp.train", *flags]
    log = os.path.join(folder, f"torchrun-{len(os.listdir(folder))}.log")
    with open(log, "w") as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                 env=os.environ | env, start_new_session=True)
        try:
            code = agent.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
            code = -9
    with open(log) as f:
        return code, f.read()


def kill_and_restart(folder: str, dp: int = 1, tp: int = 2, steps: int = 6, every: int = 2,
                     fail_at: int = 3, extra_flags: tuple = (), timeout: float = 120.0) -> dict:
    """``torchrun --max-restarts 1 ... -m minitp.train --save C --save-every N --load C``
    with rank dp*tp-1 SIGKILLed after step `fail_at` on the first attempt
    (MINITP_FAIL_AT_STEP), beside the same command never interrupted (run by `mt.launch`
    in this process: the two engines must agree too). Returns both runs' per-step losses
    ({step: loss}; the killed run's are its last attempt's, from the step it resumed at),
    the step it resumed from, whether the final losses and the final checkpoints' bytes
    are the same, the seconds each took and the killed job's torchrun log."""
    flags = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
             "--batch-size", "8", "--microbatches", "2", "--eval-every", str(steps),
             "--eval-batches", "1", "--sample-tokens", "4", "--dtype", "float64",
             "--no-progress", "--dp", str(dp), "--pp", "1", "--tp", str(tp),
             "--steps", str(steps), "--save-every", str(every), *extra_flags]
    # Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the restarted group's gloo reads the
    # dead group's addresses from the store torchrun shares with it and fails to connect
    # (measured here with torch 2.13; pytorch/pytorch#135712): docs/checkpoint.md.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    out = {}
    for name in ("killed", "uninterrupted"):
        ckpt, run = os.path.join(folder, f"{name}-ckpt"), os.path.join(folder, name)
        job = [*flags, "--save", ckpt, "--load", ckpt, "--out", run]
        started = time.perf_counter()
        if name == "killed":
            code, log = _torchrun(folder, job, dp * tp,
                                  env | {"MINITP_FAIL_AT_STEP": str(fail_at)}, timeout)
            if code != 0:
                raise RuntimeError(f"the torchrun job failed (exit {code}):\n{log[-3000:]}")
        else:  # the reference: the same command under mt.launch, in this process
            from ..train import main

            with contextlib.redirect_stdout(io.StringIO()):
                main(job)
            log = ""
        with open(os.path.join(run, "metrics.json")) as f:
            metrics = json.load(f)
        with open(os.path.join(ckpt, f"step-{steps}", "manifest.json")) as f:
            hashes = {k: v["sha256"] for k, v in json.load(f)["files"].items()}
        out[name] = {"losses": {int(k): v for k, v in metrics["train_loss"].items()},
                     "hashes": hashes, "seconds": time.perf_counter() - started, "log": log}
    killed, whole = out["killed"], out["uninterrupted"]
    return {"uninterrupted": whole["losses"], "resumed": killed["losses"],
            "resumed_from": min(killed["losses"]) - 1, "killed_at": fail_at,
            "same_final_loss": killed["losses"][steps] == whole["losses"][steps],
            "same_parameters": killed["hashes"] == whole["hashes"],
            "seconds": {"killed": killed["seconds"], "uninterrupted": whole["seconds"]},
            "log": killed["log"]}
