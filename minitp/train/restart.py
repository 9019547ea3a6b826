"""A torchrun job that survives a rank's death, run beside the same job never interrupted:
what lesson 14 ("When a rank dies") shows and asserts.

`kill_and_restart` starts ``torchrun --max-restarts 1 ... -m minitp.train --save C
--save-every N --load C`` with MINITP_FAIL_AT_STEP set (`minitp.train.save_flags`): on
the first attempt the last rank SIGKILLs itself after that step; torchrun tears the
group down and starts it again; every rank resumes from the newest complete step.
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
            from .cli import main

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
