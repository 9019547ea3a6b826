"""``python -m minitp.train``: train a 3D-parallel GPT on the embedded corpus.

    python -m minitp.train                          # 8 CPU processes, dp=2 pp=2 tp=2, SP, 1F1B
    python -m minitp.train --dp 1 --pp 1 --tp 4 --check --steps 50
    torchrun --nproc-per-node 8 -m minitp.train     # the same run, one process per GPU

The parent checks every flag before any process starts (argparse's error, exit
code 2), launches the ranks with `mt.launch` (under torchrun, `launch` runs in
place), and afterwards writes the run directory: metrics.json and pictures.
Rank 0 draws the progress bar on ``sys.__stderr__``: `mt.launch` captures what
ranks write to ``sys.stderr`` and hands it back only at the end, but the real
stream, inherited from the terminal, is still there.

Global batches are a function of (seed, step) (`minitp.data`), and every step
reseeds the RNG from (seed, step): so runs at different (dp, pp, tp) see the
same batches, and a run resumed from a checkpoint at step k continues exactly.
The last line printed is one JSON object (steps, losses, tokens/s, and with
--check the largest loss difference from the single-process reference).

(Why one file: it is one program read top to bottom: the flags and
their checks, what every rank runs, the parent, and the run directory; the
pictures themselves are `minitp.viz.run`'s.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

from . import checkpoint, data
from .config import SCHEDULE_NAMES, check_parallel_config
from .model import GPT, GPTConfig

SIZE_FLAGS = ("n_layer", "d_model", "n_head", "seq_len")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minitp.train",
        description="Train a GPT with data, pipeline and tensor parallelism on real processes "
                    "(gloo on CPU, NCCL on GPUs), on the Python standard library's source.")
    a = p.add_argument
    a("--dp", type=int, default=2, help="data-parallel size (default 2)")
    a("--pp", type=int, default=2, help="pipeline stages (default 2)")
    a("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    a("--sp", action=argparse.BooleanOptionalAction, default=True,
      help="sequence parallelism (default on)")
    a("--recompute", choices=("selective", "full"), default=None)
    a("--schedule", choices=SCHEDULE_NAMES, default="1f1b")
    a("--microbatches", type=int, default=4, help="per data-parallel rank (default 4)")
    a("--virtual-stages", type=int, default=1, help="per pipeline rank, for --schedule "
                                                    "interleaved (default 1)")
    a("--steps", type=int, default=240, help="optimizer steps in all (default 240)")
    a("--seed", type=int, default=0)
    a("--data", metavar="FILE", help="train on this text file instead of the embedded corpus")
    a("--out", metavar="DIR", help="run directory (default runs/<timestamp>)")
    a("--check", action="store_true",
      help="also train the single-process GPT on the same batches; report the largest "
           "loss difference")
    a("--save", metavar="DIR", help="write a checkpoint here at the end")
    a("--load", metavar="DIR", help="resume from this checkpoint (its sizes win; --steps is "
                                    "the total, counting the steps already done)")
    a("--n-layer", type=int, default=4)
    a("--d-model", type=int, default=64)
    a("--n-head", type=int, default=4)
    a("--seq-len", type=int, default=64)
    a("--batch-size", type=int, default=16, help="global batch, in sequences (default 16)")
    a("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    a("--dtype", choices=("float32", "float64"), default="float32")
    a("--eval-every", type=int, default=40, help="steps between evaluations (default 40)")
    a("--eval-batches", type=int, default=8)
    a("--sample-tokens", type=int, default=200, help="bytes of text sampled at the end")
    a("--prompt", default="def ")
    a("--timeout", type=float, default=300.0, help="seconds a rank may wait in a collective")
    a("--no-progress", action="store_true", help="no progress bar")
    return p


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def validate(args, parser):
    """Every check that can fail before a process starts; parser.error (exit 2) if one does.
    Returns (cfg, train_tokens, eval_tokens, start_step).

    The rules of the split (what must divide what, which schedule fits which
    virtual stages and microbatches, how the batch is cut) are
    `minitp.config.check_parallel_config`'s, given every flag they involve, so a
    run that `train_step` would refuse on every rank is refused here, once."""
    for name in ("dp", "pp", "tp", "microbatches", "virtual_stages", "steps", "batch_size",
                 "eval_every", "eval_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    start_step = 0
    if args.load:
        try:
            meta = checkpoint.read_meta(args.load)
        except (OSError, ValueError) as exc:
            parser.error(f"--load: {exc}")
        cfg = GPTConfig(**meta["config"])
        start_step = meta["step"]
        if args.steps <= start_step:
            parser.error(f"--steps {args.steps}: the checkpoint is already at step {start_step}")
    else:
        try:
            cfg = GPTConfig(vocab_size=data.VOCAB_SIZE, n_layer=args.n_layer,
                            d_model=args.d_model, n_head=args.n_head, seq_len=args.seq_len)
        except ValueError as exc:
            parser.error(str(exc))
    world = args.dp * args.pp * args.tp
    if _under_torchrun() and int(os.environ["WORLD_SIZE"]) != world:
        parser.error(f"torchrun started {os.environ['WORLD_SIZE']} processes but "
                     f"dp*pp*tp = {world}")
    try:
        check_parallel_config(cfg, dp=args.dp, pp=args.pp, tp=args.tp,
                              sequence_parallel=args.sp, recompute=args.recompute,
                              virtual_stages=args.virtual_stages, world_size=world,
                              schedule=args.schedule, microbatches=args.microbatches,
                              batch_size=args.batch_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.data and not os.path.isfile(args.data):
        parser.error(f"--data {args.data}: no such file")
    tokens = data.load_tokens(args.data)
    train_tokens, eval_tokens = data.split(tokens)
    try:
        data.check_length(train_tokens, cfg.seq_len, "training split")
        data.check_length(eval_tokens, cfg.seq_len, "held-out split (the last 5%)")
    except ValueError as exc:
        parser.error(f"{args.data or 'the corpus'}: {exc}")
    return cfg, train_tokens, eval_tokens, start_step


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of one step (dropout masks): a function of (seed, step) only."""
    return seed * 1_000_003 + step + 1


# --------------------------------------------------------------------------- ranks
def _rank(args, cfg, train_tokens, eval_tokens, start_step):
    """What every rank runs: build (or load) the model, train, evaluate, sample."""
    from . import comm, memory, trace
    from ._device import device as rank_device
    from .mesh import Mesh, world
    from .parallelize import parallelize
    from .step import train_step

    dtype, device = getattr(torch, args.dtype), rank_device()  # cuda:local_rank under NCCL
    mesh = Mesh(dp=args.dp, pp=args.pp, tp=args.tp)
    lead = mesh.rank == 0

    def new_optimizer(params):
        return torch.optim.Adam(params, lr=args.lr)

    if args.load:
        model, optimizer, _ = checkpoint.load(
            args.load, mesh, sequence_parallel=args.sp, recompute=args.recompute,
            virtual_stages=args.virtual_stages, optimizer_factory=new_optimizer)
    else:
        torch.manual_seed(args.seed)
        model = parallelize(GPT(cfg).to(device, dtype), mesh, sequence_parallel=args.sp,
                               recompute=args.recompute, virtual_stages=args.virtual_stages)
        optimizer = new_optimizer(model.parameters())
    dense = GPT(cfg).to(dtype)  # on the CPU: evaluation and sampling use the gathered weights
    eval_set = data.eval_batches(eval_tokens, args.eval_batches, args.batch_size, cfg.seq_len,
                                 args.seed)

    def evaluate() -> float:
        # Every rank scores its share of the held-out batches with the dense model,
        # then one all-reduce sums them: it works the same at any (dp, pp, tp).
        with trace.paused():
            dense.load_state_dict(model.full_state_dict())
            total = torch.zeros(2, dtype=torch.float64)
            with torch.no_grad():
                for x, y in eval_set[mesh.rank::mesh.world_size]:
                    total += torch.tensor([float(dense(x, y)[1]) * y.numel(), y.numel()],
                                          dtype=torch.float64)
            total = comm.all_reduce(total.to(device), world()).cpu()
        return float(total[0] / total[1])

    bar = None
    if lead and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=start_step, file=sys.__stderr__, unit="step",
                   mininterval=0.5, dynamic_ncols=True)
    losses, evals, seconds, ledger = [], [], 0.0, None
    traced_step = args.steps - 1
    tokens_per_step = args.batch_size * cfg.seq_len
    for step in range(start_step, args.steps):
        torch.manual_seed(step_seed(args.seed, step))
        batch = data.get_batch(train_tokens, step, args.batch_size, cfg.seq_len, args.seed)
        batch = tuple(t.to(device) for t in batch)
        started = time.perf_counter()
        with contextlib.ExitStack() as stack:
            # The trace keeps one step (the last), for its timeline and bytes: every
            # step would be 100k events. The first step's saved activations are counted.
            if step != traced_step or step == start_step:
                stack.enter_context(trace.paused())
            if step == start_step:
                ledger = stack.enter_context(memory.ActivationLedger(model))
            loss = train_step(model, batch, mesh, optimizer, schedule=args.schedule,
                                 microbatches=args.microbatches)
        elapsed = time.perf_counter() - started
        seconds += elapsed
        losses.append(loss)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            evals.append((step + 1, evaluate()))
            if bar is not None:
                bar.write(f"step {step + 1}: train loss {loss:.4f}, eval loss {evals[-1][1]:.4f}",
                          file=sys.__stderr__)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_step / elapsed:,.0f}")
            bar.update(1)
    if bar is not None:
        bar.close()
    if args.save:
        checkpoint.save(model, args.save, args.steps, optimizer,
                        extra={"seed": args.seed, "lr": args.lr})
    result = {"memory": {**memory.model_state_bytes(model, optimizer),
                         "activations": ledger.total_bytes if ledger else 0}}
    if lead:
        result.update(losses=losses, evals=evals, seconds=seconds,
                      tokens_per_s=tokens_per_step * len(losses) / seconds,
                      sample=sample(dense, args.prompt, args.sample_tokens, args.seed))
    return result


def sample(model: GPT, prompt: str, n: int, seed: int, temperature: float = 0.8) -> str:
    """`n` bytes continuing `prompt`, drawn at `temperature` from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    idx = data.encode(prompt or "\n")[None]  # (1, T)
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(idx[:, -model.cfg.seq_len:])
            probs = torch.softmax(logits[0, -1].double() / temperature, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)[None]], dim=1)
    return data.decode(idx[0])


# --------------------------------------------------------------------------- parent
def reference_losses(args, cfg, train_tokens, start_step) -> list[float]:
    """The single-process GPT trained on the same batches (for --check)."""
    dtype = getattr(torch, args.dtype)
    if args.load:
        ref, _, dense_optim = checkpoint.load_dense(args.load)
        optimizer = torch.optim.Adam(ref.parameters(), lr=args.lr)
        if dense_optim is not None:
            checkpoint.load_dense_optimizer(ref, optimizer, dense_optim)
    else:
        torch.manual_seed(args.seed)
        ref = GPT(cfg).to(dtype)
        optimizer = torch.optim.Adam(ref.parameters(), lr=args.lr)
    losses = []
    for step in range(start_step, args.steps):
        torch.manual_seed(step_seed(args.seed, step))
        x, y = data.get_batch(train_tokens, step, args.batch_size, cfg.seq_len, args.seed)
        optimizer.zero_grad(set_to_none=True)
        _, loss = ref(x, y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def main(argv=None) -> dict:
    from .launch import launch

    parser = build_parser()
    args = parser.parse_args(argv)
    cfg, train_tokens, eval_tokens, start_step = validate(args, parser)
    if args.load:
        args.dtype = checkpoint.read_meta(args.load)["dtype"]
    printer = not _under_torchrun() or os.environ["RANK"] == "0"
    world = args.dp * args.pp * args.tp
    wall = time.perf_counter()
    run = launch(_rank, world, args, cfg, train_tokens, eval_tokens, start_step,
                    timeout=args.timeout)
    lead = run[0]
    summary = {"steps": args.steps, "train_loss": lead["losses"][-1],
               "eval_loss": lead["evals"][-1][1], "tokens_per_s": round(lead["tokens_per_s"], 1)}
    if args.check and printer:
        ref = reference_losses(args, cfg, train_tokens, start_step)
        summary["max_loss_diff"] = max(abs(a - b) for a, b in zip(lead["losses"], ref,
                                                                  strict=True))
    if printer:
        out = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        write_run_dir(out, args, cfg, run, summary, start_step,
                      seconds=time.perf_counter() - wall)
        print(f"sampled text (prompt {args.prompt!r}):\n{lead['sample']}\n")
        print(f"run directory: {out}")
        print(json.dumps(summary), flush=True)
    return summary


# --------------------------------------------------------------------------- run directory
def write_run_dir(out, args, cfg, run, summary, start_step, seconds) -> None:
    """metrics.json and four pictures: loss.png, memory.png, comm.png, timeline.png
    (drawn by `minitp.viz.run` from the same numbers metrics.json holds)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened

    from . import viz

    os.makedirs(out, exist_ok=True)
    lead = run[0]
    steps = list(range(start_step + 1, args.steps + 1))
    comm_bytes: dict[str, int] = {}
    for e in run.trace:
        if e.is_comm:
            comm_bytes[e.axis] = comm_bytes.get(e.axis, 0) + e.model_bytes
    metrics = {
        "summary": summary, "args": vars(args), "config": vars(cfg), "seconds": seconds,
        "train_loss": dict(zip(steps, lead["losses"], strict=True)),
        "eval_loss": dict(lead["evals"]), "sample": lead["sample"],
        "memory_per_rank": [r["memory"] for r in run],
        "wire_bytes_per_axis_one_step": comm_bytes,
    }
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)

    figures = {
        "loss": viz.run_losses(steps, lead["losses"], lead["evals"],
                               title=f"dp={args.dp} pp={args.pp} tp={args.tp}"),
        "memory": viz.run_memory(metrics["memory_per_rank"]),
        "comm": viz.run_wire_bytes(comm_bytes),
        "timeline": viz.timeline(run, title=f"step {args.steps}: every rank"),
    }
    for name, fig in figures.items():
        fig.savefig(os.path.join(out, f"{name}.png"), dpi=100, bbox_inches="tight")


if __name__ == "__main__":
    main()
