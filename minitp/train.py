"""``python -m minitp.train``: train a 3D-parallel GPT on the embedded corpus.

    python -m minitp.train                          # 8 CPU processes, dp=2 pp=2 tp=2, SP, 1F1B
    python -m minitp.train --dp 1 --pp 1 --tp 4 --check --steps 50
    python -m minitp.train --cp 2 --tp 2 --dp 2 --pp 1 --check  # context parallelism
    torchrun --nproc-per-node 8 -m minitp.train     # the same run, one process per GPU

The parent checks every flag before any process starts (argparse's error, exit
code 2), launches the ranks with `mt.launch` (under torchrun, `launch` runs in
place), and afterwards writes the run directory: metrics.json and pictures.
Rank 0 draws the progress bar on the launch's console (`minitp._worker.console`):
`mt.launch` captures what ranks write to ``sys.stderr`` and hands it back only at
the end, while console text reaches the launcher's terminal as it is written.

Global batches are a function of (seed, step) (`minitp.data`), and every step
reseeds the RNG from (seed, step): so runs at different (dp, pp, tp) see the
same batches, and a run resumed from a checkpoint at step k continues exactly.
The last line printed is one JSON object (steps, losses, tokens/s, model FLOP/s
and MFU against the peak `minitp.peak` gives — a GPU's datasheet figure, a CPU's
measured at start — and with --check the largest loss difference from the
single-process reference).

(Why one file: it is one program read top to bottom: the flags and
their checks, what every rank runs, the parent, and the run directory; the
pictures themselves are `minitp.viz.run`'s.)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import sys
import time

import torch

from . import checkpoint, data, peak
from ._worker import console
from .config import SCHEDULE_NAMES, ZERO_STAGES, check_parallel_config
from .errors import LaunchError
from .model import GPT, GPTConfig

MODEL_SIZES = {"n-layer": 4, "d-model": 64, "n-head": 4, "seq-len": 64}  # the defaults
# Measured on the default run's model: at 0.6 and 0.7 its sample ends in a run of spaces
# longer than the context, which it never leaves; at 0.8 it leaves one after ~90 spaces;
# at 0.9 it keeps Python's shape (docs/default-run.md).
TEMPERATURE = 0.9


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake costs one line: its ~20-line usage block is for --help."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists every flag)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m minitp.train",
        description="Train a GPT with data, pipeline and tensor parallelism on real processes "
                    "(gloo on CPU, NCCL on GPUs), on the Python standard library's source.")
    a = p.add_argument
    a("--dp", type=int, default=2, help="data-parallel size (default 2)")
    a("--pp", type=int, default=2, help="pipeline stages (default 2)")
    a("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    a("--cp", type=int, default=1, help="context-parallel size: each sequence split over cp "
                                        "ranks, attention by ring (default 1)")
    a("--sp", action=argparse.BooleanOptionalAction, default=True,
      help="sequence parallelism (default on)")
    a("--tp-overlap", action="store_true",
      help="overlap sequence parallelism's all-gathers and reduce-scatters with the GEMMs, "
           "chunk by chunk (needs --sp and --tp > 1)")
    a("--recompute", choices=("selective", "full"), default=None)
    a("--schedule", choices=SCHEDULE_NAMES, default="1f1b")
    a("--zero-stage", type=int, choices=ZERO_STAGES, default=0,
      help="ZeRO over the data-parallel axis: 1 shards Adam's state, 2 also the gradients, "
           "3 also the parameters (default 0: none)")
    a("--microbatches", type=int, default=2, help="per data-parallel rank (default 2: the fewest "
                                                  "that still overlap the two stages)")
    a("--virtual-stages", type=int, default=1, help="per pipeline rank, for --schedule "
                                                    "interleaved (default 1)")
    a("--steps", type=int, default=400, help="optimizer steps in all (default 400)")
    a("--seed", type=int, default=0)
    a("--data", metavar="FILE", help="train on this text file instead of the embedded corpus")
    a("--out", metavar="DIR", help="run directory (default runs/<timestamp>)")
    a("--check", action="store_true",
      help="also train the single-process GPT on the same batches; report the largest "
           "loss difference")
    a("--save", metavar="DIR", help="write a checkpoint here at the end")
    a("--load", metavar="DIR", help="resume from this checkpoint (its sizes win; --steps is "
                                    "the total, counting the steps already done)")
    # The model's sizes default to None so that --load can tell a size given on the
    # command line (and refuse one the checkpoint contradicts) from one left out.
    for flag, default in MODEL_SIZES.items():
        a(f"--{flag}", type=int, default=None, help=f"(default {default}; with --load, the "
                                                    "checkpoint's)")
    a("--batch-size", type=int, default=64, help="global batch, in sequences (default 64)")
    a("--lr", type=float, default=2e-3, help="Adam's peak learning rate (default 2e-3)")
    a("--warmup", type=int, default=0, help="steps of linear warm-up to --lr (default 0)")
    a("--lr-schedule", choices=("cosine", "constant"), default="constant",
      help="after warm-up: cosine decay to a tenth of --lr at --lr-decay-steps, or "
           "constant (default constant: over the default 400 steps a cosine measured worse)")
    a("--lr-decay-steps", type=int, default=None, metavar="N",
      help="the step where the cosine ends (default --steps; give the same N to a run "
           "and to its resumed continuation so both follow one schedule)")
    a("--dtype", choices=("float32", "float64", "bfloat16"), default="float32",
      help="bfloat16: mixed precision (bf16 parameters and activations, float32 gradients "
           "and master weights; --check then compares with a float64 reference)")
    a("--eval-every", type=int, default=40, help="steps between evaluations (default 40)")
    a("--eval-batches", type=int, default=8)
    a("--sample-tokens", type=int, default=200, help="bytes of text sampled at the end")
    a("--temperature", type=float, default=TEMPERATURE,
      help="sampling temperature: lower is more repetitive, higher more random "
           f"(default {TEMPERATURE})")
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
    for name in ("dp", "pp", "cp", "tp", "microbatches", "virtual_stages", "steps", "batch_size",
                 "eval_every", "eval_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("lr", "temperature"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be at least 0, got {args.warmup}")
    if args.lr_decay_steps is not None and args.lr_decay_steps < 1:
        parser.error(f"--lr-decay-steps must be at least 1, got {args.lr_decay_steps}")
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
        for flag in MODEL_SIZES:
            given, saved = getattr(args, flag.replace("-", "_")), getattr(cfg, flag.replace(
                "-", "_"))
            if given is not None and given != saved:
                parser.error(f"--{flag} {given}: the checkpoint's model has {saved} (its sizes "
                             f"are the run's; leave --{flag} out)")
    else:
        for flag, default in MODEL_SIZES.items():
            if getattr(args, flag.replace("-", "_")) is None:
                setattr(args, flag.replace("-", "_"), default)
        try:
            cfg = GPTConfig(vocab_size=data.VOCAB_SIZE, n_layer=args.n_layer,
                            d_model=args.d_model, n_head=args.n_head, seq_len=args.seq_len)
        except ValueError as exc:
            parser.error(str(exc))
    world = _world(args)
    if _under_torchrun() and int(os.environ["WORLD_SIZE"]) != world:
        product = "dp*pp*cp*tp" if args.cp > 1 else "dp*pp*tp"
        parser.error(f"torchrun started {os.environ['WORLD_SIZE']} processes but "
                     f"{product} = {world}")
    try:
        check_parallel_config(cfg, dp=args.dp, pp=args.pp, tp=args.tp, cp=args.cp,
                              sequence_parallel=args.sp, recompute=args.recompute,
                              virtual_stages=args.virtual_stages, world_size=world,
                              schedule=args.schedule, microbatches=args.microbatches,
                              batch_size=args.batch_size, zero_stage=args.zero_stage,
                              param_dtype="bfloat16" if _mixed(args) else None)
    except ValueError as exc:
        parser.error(str(exc))
    if args.tp_overlap and not (args.sp and args.tp > 1):
        parser.error(f"--tp-overlap overlaps sequence parallelism's collectives with the GEMMs: "
                     f"it needs --sp and --tp > 1 (got {'--sp' if args.sp else '--no-sp'}, "
                     f"--tp {args.tp})")
    if _mixed(args) and (args.save or args.load):
        parser.error("--dtype bfloat16 with --save/--load: checkpoints of a mixed-precision run "
                     "would lose its float32 master weights, so minitp does not write them yet")
    need, have = memory_needed(args, cfg), available_memory()
    if have is not None and need["machine"] > have:
        parser.error(
            f"this run needs about {_gib(need['per_rank'])} per rank, "
            f"{_gib(need['machine'])} for its {need['ranks']} processes on this machine "
            f"(a model: minitp.calc's parameters, gradients, Adam state and activations, plus "
            f"each rank's dense copy), but only {_gib(have)} is available: try a smaller "
            f"--d-model, --n-layer, --seq-len or --batch-size")
    if args.save:
        try:  # now, not after the whole run has trained
            checkpoint.check_save_target(args.save)
        except OSError as exc:
            parser.error(f"--save: {exc}")
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


def _mixed(args) -> bool:
    return args.dtype == "bfloat16"


def _world(args) -> int:
    return args.dp * args.pp * args.cp * args.tp


def _sizes(args) -> str:
    return (f"dp={args.dp} pp={args.pp} " + (f"cp={args.cp} " if args.cp > 1 else "")
            + f"tp={args.tp}")


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def memory_needed(args, cfg) -> dict:
    """Bytes this run will hold, as `minitp.calc` models them (not measured):
    ``{"per_rank", "ranks", "machine"}``.

    Per rank: `calc.memory_per_gpu` with fp32 Adam (4 + 4 + 8 bytes per
    parameter; twice that in float64) and the paper's 2-byte activations scaled
    to --dtype, plus the dense CPU model every rank keeps for evaluation and
    sampling and the full state dict it copies into it (two copies of every
    parameter). On the CPU every rank shares this machine's memory, so "machine"
    is all of them plus, with --check, the single-process reference; under
    torchrun it counts this node's ranks; on GPUs only the dense copies and the
    reference stay on the host. Python's and torch's own ~0.3 GB per process
    are left out: the check is for runs that cannot fit, not a close call.
    """
    from . import calc

    mixed = _mixed(args)  # bf16 with float32 gradients and masters: the 18-byte layout
    scale = 1 if mixed else torch.tensor([], dtype=getattr(torch, args.dtype)).element_size() / 4
    world = _world(args)
    micro = max(1, args.batch_size // (args.dp * args.microbatches))
    on_rank = calc.memory_per_gpu(cfg, micro, args.dp, args.pp, args.tp, args.sp,
                                  args.recompute, args.zero_stage,
                                  "megatron" if mixed else "adam-fp32", args.virtual_stages,
                                  args.microbatches, cp=args.cp)
    states = sum(on_rank[k] for k in ("parameters", "gradients", "optimizer"))
    per_rank = scale * (states + (1 if mixed else 2) * on_rank["activations"])
    dense = scale * 4 * 2 * calc.exact_param_count(cfg)  # float32 copies when mixed
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if _under_torchrun() else world
    host = ranks * (dense + (0 if _on_gpus(world) else per_rank))
    if args.check:
        ref = calc.memory_per_gpu(cfg, args.batch_size, optimizer="adam-fp32")
        host += scale * (sum(ref[k] for k in ("parameters", "gradients", "optimizer"))
                         + 2 * ref["activations"])
    return {"per_rank": per_rank + dense, "ranks": ranks, "machine": host}


def available_memory() -> int | None:
    """Bytes the machine can give without swapping: Linux's MemAvailable (free
    plus reclaimable cache), else free physical pages; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def lr_at(args, step: int) -> float:
    """The learning rate of `step` (0-based): linear warm-up over --warmup steps to
    --lr, then constant or a cosine down to --lr/10 at --lr-decay-steps. A
    function of the step alone, so a resumed run continues the same schedule."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if args.lr_schedule == "constant":
        return args.lr
    end = args.lr_decay_steps or args.steps
    progress = min(1.0, (step - args.warmup) / max(1, end - args.warmup))
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def _set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of one step (dropout masks): a function of (seed, step) only."""
    return seed * 1_000_003 + step + 1


# --------------------------------------------------------------------------- ranks
def _rank(args, cfg, train_tokens, eval_tokens, start_step, peak_flops=None):
    """What every rank runs: build (or load) the model, train, evaluate, sample.
    peak_flops: the run's peak FLOP/s (`minitp.peak`), for the progress bar's MFU."""
    from . import calc, comm, memory, trace, zero
    from ._device import device as rank_device
    from .mesh import Mesh, world
    from .parallelize import parallelize
    from .step import train_step

    # Mixed precision: the float32 model is cast by parallelize (param_dtype) and
    # the dense copy for evaluation stays float32.
    dtype = torch.float32 if _mixed(args) else getattr(torch, args.dtype)
    device = rank_device()  # cuda:local_rank under NCCL
    mesh = Mesh(dp=args.dp, pp=args.pp, tp=args.tp, cp=args.cp)
    lead = mesh.rank == 0

    def new_optimizer(tensors):  # what this rank steps: parameters, or ZeRO's shards of them
        return torch.optim.Adam(tensors, lr=args.lr)

    plan = dict(sequence_parallel=args.sp, recompute=args.recompute,
                virtual_stages=args.virtual_stages, zero_stage=args.zero_stage,
                tp_overlap=args.tp_overlap)
    if _mixed(args):
        plan["param_dtype"] = torch.bfloat16
    if args.load:
        model, optimizer, _ = checkpoint.load(args.load, mesh, optimizer_factory=new_optimizer,
                                              **plan)
    else:
        torch.manual_seed(args.seed)
        model = parallelize(GPT(cfg).to(device, dtype), mesh, **plan)
        optimizer = zero.make_optimizer(model, mesh, new_optimizer)
    dense = GPT(cfg).to(dtype)  # on the CPU: evaluation and sampling use the gathered weights
    eval_set = data.eval_batches(eval_tokens, args.eval_batches, args.batch_size, cfg.seq_len,
                                 args.seed)

    def evaluate() -> float:
        # Every rank scores its share of the held-out batches with the dense model,
        # then one all-reduce sums them: it works the same at any (dp, pp, tp).
        with trace.paused():
            with zero.gathered(model):  # stage 3 keeps only shards between steps
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

        bar = tqdm(total=args.steps, initial=start_step, file=console(), unit="step",
                   mininterval=0.5, dynamic_ncols=True)
    losses, evals, seconds, ledger = [], [], 0.0, None
    traced_step = args.steps - 1
    tokens_per_step = args.batch_size * cfg.seq_len
    flops_per_step = calc.model_flops(cfg, args.batch_size)
    for step in range(start_step, args.steps):
        torch.manual_seed(step_seed(args.seed, step))
        batch = data.get_batch(train_tokens, step, args.batch_size, cfg.seq_len, args.seed)
        batch = tuple(t.to(device) for t in batch)
        _set_lr(optimizer, lr_at(args, step))
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
                          file=console())
        if bar is not None:
            shown = dict(loss=f"{loss:.3f}", tok_s=f"{tokens_per_step / elapsed:,.0f}")
            if peak_flops:
                shown["mfu"] = f"{calc.mfu(flops_per_step, elapsed, 1, peak_flops):.1%}"
            bar.set_postfix(**shown)
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
                      sample=sample(dense, args.prompt, args.sample_tokens, args.seed,
                                    args.temperature))
    return result


def sample(model: GPT, prompt: str, n: int, seed: int,
           temperature: float = TEMPERATURE) -> str:
    """About `n` bytes continuing `prompt`, drawn at `temperature` from a seeded generator.

    Tokens are bytes, so the model could draw bytes that are not UTF-8 (a
    continuation byte with no lead, a character cut off at the end): each draw
    is restricted to the bytes that keep the text valid UTF-8 (`_utf8_allowed`),
    and sampling goes on past `n` until the last character is whole. The result
    always decodes, with no replacement characters."""
    generator = torch.Generator().manual_seed(seed)
    idx = data.encode(prompt or "\n")[None]  # (1, T)
    pending: list[int] = []  # the bytes of a character begun but not finished
    with torch.no_grad():
        for i in itertools.count():
            if i >= n and not pending:
                break
            logits, _ = model(idx[:, -model.cfg.seq_len:])
            logits = logits[0, -1].double() / temperature
            logits[~_utf8_allowed(pending)] = -math.inf
            token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
            pending = _utf8_after(pending, token)
            idx = torch.cat([idx, torch.tensor([[token]])], dim=1)
    return bytes(idx[0].tolist()).decode("utf-8")


def _utf8_allowed(pending: list[int]) -> torch.Tensor:
    """(256,) bool: the bytes that may come next in valid UTF-8 after `pending`,
    the unfinished character so far (RFC 3629, Table 3-7 of the Unicode standard)."""
    ok = torch.zeros(256, dtype=torch.bool)
    if not pending:
        ok[0x00:0x80] = ok[0xC2:0xF5] = True  # ASCII, or the lead byte of 2-4 bytes
        return ok
    low, high = 0x80, 0xBF  # a continuation byte; the second byte of some leads is narrower
    if len(pending) == 1:
        low, high = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF),
                     0xF4: (0x80, 0x8F)}.get(pending[0], (low, high))
    ok[low:high + 1] = True
    return ok


def _utf8_after(pending: list[int], token: int) -> list[int]:
    """The unfinished character after `token`: [] once it is complete."""
    pending = [*pending, token]
    lead = pending[0]
    length = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return [] if len(pending) == length else pending


# --------------------------------------------------------------------------- parent
def reference_losses(args, cfg, train_tokens, start_step) -> list[float]:
    """--check's per-step losses: `train_one_process` on the run's batches. It runs
    after the ranks, with a progress bar of its own (half a minute by default)."""
    return train_one_process(args, cfg, train_tokens, start_step)[1]


def train_one_process(args, cfg, train_tokens, start_step: int = 0) -> tuple[GPT, list[float]]:
    """The plain GPT trained in this process on the batches, schedule and optimizer
    the ranks use (or resumed from --load); in float64 for a mixed-precision run,
    which it then shows how closely bf16 tracks. Returns (model, per-step losses)."""
    dtype = torch.float64 if _mixed(args) else getattr(torch, args.dtype)
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
    steps = range(start_step, args.steps)
    if not args.no_progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc="--check, one process", unit="step", file=sys.stderr,
                     mininterval=0.5, dynamic_ncols=True)
    for step in steps:
        torch.manual_seed(step_seed(args.seed, step))
        x, y = data.get_batch(train_tokens, step, args.batch_size, cfg.seq_len, args.seed)
        _set_lr(optimizer, lr_at(args, step))
        optimizer.zero_grad(set_to_none=True)
        _, loss = ref(x, y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return ref, losses


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg, train_tokens, eval_tokens, start_step = validate(args, parser)
    if args.load:
        args.dtype = checkpoint.read_meta(args.load)["dtype"]
    try:
        return _train(args, cfg, train_tokens, eval_tokens, start_step)
    except KeyboardInterrupt:
        # The launcher has already stopped every rank; a traceback here would only
        # show where the parent happened to be waiting.
        sys.stderr.write(f"{parser.prog}: stopped by Ctrl-C (every rank stopped)\n")
        raise SystemExit(130) from None
    except LaunchError as error:
        # Its message names the rank and ends with that rank's own traceback; the
        # frames of this process above it would only bury that.
        sys.stderr.write(f"{parser.prog}: {error}\n")
        raise SystemExit(1) from None


def _train(args, cfg, train_tokens, eval_tokens, start_step) -> dict:
    from .launch import launch

    printer = not _under_torchrun() or os.environ["RANK"] == "0"
    world = _world(args)
    # Measured in this process before any rank starts (on a CPU), so that the ranks'
    # own work does not slow the measurement of what the machine can do.
    run_peak = _run_peak(world, args)
    wall = time.perf_counter()
    run = launch(_rank, world, args, cfg, train_tokens, eval_tokens, start_step,
                    run_peak.total if run_peak else None, timeout=args.timeout)
    lead = run[0]
    summary = {"steps": args.steps, "train_loss": lead["losses"][-1],
               "eval_loss": lead["evals"][-1][1], "tokens_per_s": round(lead["tokens_per_s"], 1)}
    summary.update(_utilisation(cfg, args, lead, run_peak))
    ref = None
    if args.check and printer:
        ref = reference_losses(args, cfg, train_tokens, start_step)
        summary["max_loss_diff"] = max(abs(a - b) for a, b in zip(lead["losses"], ref,
                                                                  strict=True))
    if printer:
        out = args.out or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        write_run_dir(out, args, cfg, run, summary, start_step,
                      seconds=time.perf_counter() - wall, reference=ref)
        print(f"sampled text (prompt {args.prompt!r}, temperature {args.temperature}):\n"
              f"{lead['sample']}\n")
        print(f"run directory: {out}")
        print(json.dumps(summary), flush=True)
    return summary


def _on_gpus(world: int) -> bool:
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if _under_torchrun() else world
    return torch.cuda.is_available() and torch.cuda.device_count() >= ranks


def _run_peak(world: int, args):
    on_gpus = _on_gpus(world)
    if _under_torchrun() and not on_gpus:
        return None  # every rank would measure the shared cores at once: a wrong peak
    return peak.peak(on_gpus, world, getattr(torch, args.dtype))


def _utilisation(cfg, args, lead, run_peak) -> dict:
    """Model FLOP/s (Korthikanti et al.'s model FLOPs: recomputation not counted) and
    MFU, with where the peak came from; no MFU where the peak is not known."""
    from . import calc

    achieved = calc.model_flops(cfg, args.batch_size) * len(lead["losses"]) / lead["seconds"]
    out = {"model_flops_per_s": float(f"{achieved:.6g}")}
    if run_peak is None:
        out["mfu"], out["peak_source"] = None, (
            "not measured: under torchrun on a CPU every rank would measure at once"
            if _under_torchrun() and not _on_gpus(_world(args))
            else "no datasheet peak for this GPU and dtype")
    else:
        out["mfu"] = float(f"{achieved / run_peak.total:.6g}")
        out["peak_flops"] = float(f"{run_peak.total:.6g}")
        out["peak_source"] = run_peak.source
    return out


# --------------------------------------------------------------------------- run directory
def write_run_dir(out, args, cfg, run, summary, start_step, seconds, reference=None) -> None:
    """metrics.json and four pictures: loss.png, memory.png, comm.png, timeline.png
    (drawn by `minitp.viz.run` from the same numbers metrics.json holds)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened

    from . import viz

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
    }
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)

    figures = {
        "loss": viz.run_losses(steps, lead["losses"], lead["evals"], reference=reference,
                               title=_sizes(args)),
        "memory": viz.run_memory(metrics["memory_per_rank"]),
        "comm": viz.run_wire_bytes(comm_bytes, measured=sent if any(
            v is not None for v in sent.values()) else None),
        "timeline": viz.timeline(run, title=f"step {args.steps}, every rank (F0/B0: forward/"
                                            f"backward of microbatch 0)"),
    }
    for name, fig in figures.items():
        fig.savefig(os.path.join(out, f"{name}.png"), dpi=100, bbox_inches="tight")


if __name__ == "__main__":
    main()
