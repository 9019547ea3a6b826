"""``python -m minitp.train``: train a 3D-parallel GPT on the embedded corpus.

    python -m minitp.train                          # 8 CPU processes, dp=2 pp=2 tp=2, SP, 1F1B
    python -m minitp.train --dp 1 --pp 1 --tp 4 --check --steps 50
    python -m minitp.train --cp 2 --tp 2 --dp 2 --pp 1 --check  # context parallelism
    torchrun --nproc-per-node 8 -m minitp.train     # the same run, one process per GPU

The parent checks every flag before any process starts (argparse's error, exit
code 2), launches the ranks with `mt.launch` (under torchrun, `launch` runs in
place), and afterwards writes the run directory: metrics.json and pictures.
Rank 0 draws the progress bar on the launch's console (`minitp.runtime._worker.console`):
`mt.launch` captures what ranks write to ``sys.stderr`` and hands it back only at
the end, while console text reaches the launcher's terminal as it is written.

Global batches are a function of (seed, step) (`minitp.data`), and every step
reseeds the RNG from (seed, step): so runs at different (dp, pp, tp) see the
same batches, and a run resumed from a checkpoint at step k continues exactly.
The last line printed is one JSON object (steps, losses, tokens/s, model FLOP/s
and MFU against the peak `minitp.runtime.peak` gives — a GPU's datasheet figure, a CPU's
measured at start — and with --check the largest loss difference from the
single-process reference).

Where each part lives: `minitp.train.flags` (the flags and their checks),
`minitp.train.rank` (what every rank runs); this module is the parent: it launches
the ranks, trains the --check reference, and writes the run directory.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from .. import checkpoint
from ..model import GPT
from ..model.moe import update_expert_bias
from ..runtime import peak
from ..runtime.errors import LaunchError
from . import divergence, fp8_flags, optim_flags, refit_flags, save_flags
from .flags import build_parser, sizes_text, validate
from .machine import on_gpus, under_torchrun, uses_mixed_precision, world_size_of
from .model_flags import DTYPE
from .rank import batch_of, lr_at, run_rank, set_lr, step_seed


# --------------------------------------------------------------------------- parent
def reference_losses(args, cfg, train_tokens, start_step) -> list[float]:
    """--check's per-step losses: `train_one_process` on the run's batches. It runs
    after the ranks, with a progress bar of its own (half a minute by default)."""
    return train_one_process(args, cfg, train_tokens, start_step)[1]


def train_one_process(args, cfg, train_tokens, start_step: int = 0) -> tuple[GPT, list[float]]:
    """The plain GPT trained in this process on the batches, schedule and optimizer
    the ranks use (or resumed from --load); in float64 for a mixed-precision run,
    which it then shows how closely bf16 tracks. Returns (model, per-step losses)."""
    dtype = torch.float64 if uses_mixed_precision(args) else getattr(torch, args.dtype or DTYPE)
    if args.load:  # cfg: the checkpoint's, with the routing flags given (model_flags)
        ref, _, dense_optim = checkpoint.load_dense(args.load, config=cfg)
        optimizer = optim_flags.one_process(ref, args)
        if dense_optim is not None:
            checkpoint.load_dense_optimizer(ref, optimizer, dense_optim)
    else:
        torch.manual_seed(args.seed)
        ref = fp8_flags.one_process(GPT(cfg).to(dtype), args)  # FP8: its one-process run
        optimizer = optim_flags.one_process(ref, args)  # Adam, or Muon+AdamW
    losses = []
    steps = range(start_step, args.steps)
    if not args.no_progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc="--check, one process", unit="step", file=sys.stderr,
                     mininterval=0.5, dynamic_ncols=True)
    for step in steps:
        torch.manual_seed(step_seed(args.seed, step))
        x, y, *packed = batch_of(args, cfg, train_tokens, step)
        set_lr(optimizer, lr_at(args, step))
        optimizer.zero_grad(set_to_none=True)
        loss = fp8_flags.forward_backward(ref, args, x, y, packed[0] if packed else None)
        if args.clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), args.clip_grad)
        optimizer.step()
        update_expert_bias(ref)  # as train_step does (a no-op without bias-balanced experts)
        losses.append(loss)
    return ref, losses


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg, train_tokens, eval_tokens, start_step = validate(args, parser)  # args: what runs
    try:
        return _train(args, cfg, train_tokens, eval_tokens, start_step)
    except KeyboardInterrupt:
        # The launcher has already stopped every rank; a traceback here would only
        # show where the parent happened to be waiting.
        sys.stderr.write(f"{parser.prog}: stopped by Ctrl-C (every rank stopped)\n")
        raise SystemExit(130) from None
    except divergence.Stopped as stop:
        # A diverged run (`minitp.train.divergence`): the step and its number, and exit 1,
        # since the flags were valid (exit 2 says a run was refused before it started).
        if not under_torchrun() or os.environ["RANK"] == "0":
            sys.stderr.write(f"{parser.prog}: {stop}\n")
        raise SystemExit(1) from None
    except LaunchError as error:
        # Its message names the rank and ends with that rank's own traceback; the
        # frames of this process above it would only bury that. A failed save says
        # what failed in its one line (save_flags.reported), with no traceback.
        sys.stderr.write(f"{parser.prog}: {save_flags.failure_line(error) or error}\n")
        raise SystemExit(1) from None


def _train(args, cfg, train_tokens, eval_tokens, start_step) -> dict:
    from ..runtime.launch import launch

    printer = not under_torchrun() or os.environ["RANK"] == "0"
    world = world_size_of(args)
    # Measured in this process before any rank starts (on a CPU), so that the ranks'
    # own work does not slow the measurement of what the machine can do.
    run_peak = _run_peak(world, args)
    wall = time.perf_counter()
    run = launch(run_rank, world + refit_flags.extra_ranks(args), args, cfg, train_tokens,
                 eval_tokens, start_step, run_peak and run_peak.total, timeout=args.timeout)
    lead = run[0]
    if "stopped" in lead:  # every rank stopped at the same step; nothing to write
        raise divergence.Stopped(lead["stopped"])
    summary = {"steps": args.steps, "train_loss": lead["losses"][-1],
               "eval_loss": lead["evals"][-1][1], "tokens_per_s": round(lead["tokens_per_s"], 1)}
    summary.update(_utilisation(cfg, args, lead, run_peak))
    summary.update(refit_flags.summary(lead))  # --refit-every's bytes, seconds, log-prob diff
    ref = None
    if args.check and printer:
        ref = reference_losses(args, cfg, train_tokens, start_step)
        summary["max_loss_diff"] = max(abs(a - b) for a, b in zip(lead["losses"], ref,
                                                                  strict=True))
    if printer:
        out = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        write_run_dir(out, args, cfg, run, summary, start_step,
                      seconds=time.perf_counter() - wall, reference=ref)
        if args.trace_out:  # checked writable before the run (`values`); a full disk still
            try:  # answers in one line
                run.trace.to_chrome(args.trace_out)
            except ValueError as exc:
                sys.stderr.write(f"python -m minitp.train: --trace-out: {exc}\n")
                raise SystemExit(1) from None
            print(f"trace: {args.trace_out} (open it in https://ui.perfetto.dev)")
        print(f"sampled text (prompt {args.prompt!r}, temperature {args.temperature}):\n"
              f"{lead['sample']}\n")
        print(f"run directory: {out}")
        print(json.dumps(summary), flush=True)
    return summary


def _run_peak(world: int, args):
    gpus = on_gpus(world)
    if under_torchrun() and not gpus:
        return None  # every rank would measure the shared cores at once: a wrong peak
    return peak.peak(gpus, world, getattr(torch, args.dtype))


def _utilisation(cfg, args, lead, run_peak) -> dict:
    """Model FLOP/s (Korthikanti et al.'s model FLOPs: recomputation not counted) and
    MFU, with where the peak came from; no MFU (null, and why) where the peak is not
    known: a GPU not in the table, or a CPU whose measurement did not hold together."""
    from .. import calc

    achieved = calc.model_flops(cfg, args.batch_size) * len(lead["losses"]) / lead["seconds"]
    out = {"model_flops_per_s": float(f"{achieved:.6g}")}
    if run_peak is None:
        out["mfu"], out["peak_source"] = None, (
            "not measured: under torchrun on a CPU every rank would measure at once"
            if under_torchrun() and not on_gpus(world_size_of(args))
            else "no datasheet peak for this GPU and dtype")
    elif run_peak.total is None:
        out["mfu"], out["peak_source"] = None, run_peak.source
    else:
        out["mfu"] = float(f"{achieved / run_peak.total:.6g}")
        out["peak_flops"] = float(f"{run_peak.total:.6g}")
        out["peak_source"] = run_peak.source
    return out


# --------------------------------------------------------------------------- run directory
def write_run_dir(out, args, cfg, run, summary, start_step, seconds, reference=None) -> None:
    """metrics.json and four pictures: loss.png, memory.png, comm.png, timeline.png
    (drawn by `minitp.course.viz.run` from the same numbers metrics.json holds; a
    one-process run's comm.png says that nothing was sent)."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # a terminal: files only, no display needed.
        matplotlib.use("Agg")  # (In a notebook that calls this, its inline backend stays.)

    from ..course import viz

    os.makedirs(out, exist_ok=True)
    lead = run[0]
    steps = list(range(start_step + 1, args.steps + 1))
    comm_bytes: dict[str, int] = {}
    sent: dict[str, int | None] = {}  # measured; None once one op of the axis was not
    for e in run.trace:
        if e.is_comm:
            comm_bytes[e.axis] = comm_bytes.get(e.axis, 0) + e.model_bytes
            measured = getattr(e, "sent_bytes", None)
            sent[e.axis] = (None if measured is None or sent.get(e.axis, 0) is None
                            else sent.get(e.axis, 0) + measured)
    metrics = {
        "summary": summary, "args": vars(args), "config": vars(cfg), "seconds": seconds,
        "train_loss": dict(zip(steps, lead["losses"], strict=True)),
        "eval_loss": dict(lead["evals"]), "sample": lead["sample"],
        "reference_train_loss": (dict(zip(steps, reference, strict=True))
                                 if reference is not None else None),
        "memory_per_rank": [r["memory"] for r in run],
        # the ring formula's bytes (a MODEL) beside what the ranks' sockets measured
        "model_bytes_per_axis_one_step": comm_bytes,
        "sent_bytes_per_axis_one_step": sent,
        "refits": lead.get("refits"),  # --refit-every: each refit's bytes, seconds, diff
    }
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)

    measured = sent if any(v is not None for v in sent.values()) else None
    figures = {
        "loss": viz.run_losses(steps, lead["losses"], lead["evals"], reference=reference,
                               title=sizes_text(args)),
        "memory": viz.run_memory(metrics["memory_per_rank"]),
        "comm": (viz.run_wire_bytes(comm_bytes, measured=measured) if comm_bytes
                 else _nothing_sent(getattr(args, "impl", "minitp"))),  # or not traced
        "timeline": viz.timeline(run, title=f"step {args.steps}, every rank (F0/B0: forward/"
                                            f"backward of microbatch 0)"),
    }
    for name, fig in figures.items():
        fig.savefig(os.path.join(out, f"{name}.png"), dpi=100, bbox_inches="tight")


def _nothing_sent(impl: str = "minitp"):
    """comm.png of a run whose trace holds no collective: a line that says why (one
    process sends nothing; under --impl torch, torch's collectives bypass minitp's trace).
    A chart of no bars would have an empty y range (matplotlib warns of identical ylims)."""
    from matplotlib.figure import Figure

    why = ("not traced: --impl torch runs PyTorch's own collectives" if impl == "torch"
           else "none (one process: no communication)")
    fig = Figure(figsize=(8, 0.6))
    fig.text(0.5, 0.5, f"bytes on the wire per axis, one step: {why}", ha="center",
             va="center", fontsize=10)
    return fig

