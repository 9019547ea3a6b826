"""What every rank of `python -m minitp.train` runs: build (or load) the model, train
with the learning-rate schedule and per-step seeds, evaluate, sample; rank 0 draws
the progress bar on the launch's console.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time

import torch

from .. import checkpoint, data
from ..data import images as vision_data
from ..data import packing
from ..model import GPT
from ..rules import IGNORE_INDEX, placement_of
from ..runtime._worker import console
from . import divergence, optim_flags, save_flags
from .flags import TEMPERATURE
from .fp8_flags import one_process as fp8_one_process
from .fp8_flags import plan_options as fp8_plan
from .impl_flags import impl_functions
from .machine import uses_mixed_precision


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


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of one step (dropout masks): a function of (seed, step) only."""
    return seed * 1_000_003 + step + 1


def batch_of(args, cfg, corpus, step: int):
    """The global batch of `step`: (x, y), or with --pack (x, y, positions) drawn from the
    documents `corpus` holds then (`minitp.data.packing`)."""
    if args.pack:
        return packing.get_packed_batch(corpus, step, args.batch_size, cfg.seq_len, args.seed)
    return vision_data.batch_for(cfg, corpus, step, args.batch_size, args.seed)


def run_rank(args, cfg, train_tokens, eval_tokens, start_step, peak_flops=None):
    """What every rank runs: build (or load) the model, train, evaluate, sample.
    peak_flops: the run's peak FLOP/s (`minitp.runtime.peak`), for the progress bar's MFU."""
    from .. import calc, memory
    from ..data_parallel import zero
    from ..parallelize import parallelize
    from ..runtime import comm, trace
    from ..runtime._device import device as rank_device
    from ..runtime.mesh import Mesh, world
    from ..step import train_step

    parallelize, make_optimizer, train_step = impl_functions(  # --impl torch: torch's three
        args, parallelize, zero.make_optimizer, train_step)

    # Mixed precision: the float32 model is cast by parallelize (param_dtype) and
    # the dense copy for evaluation stays float32.
    dtype = torch.float32 if uses_mixed_precision(args) else getattr(torch, args.dtype)
    device = rank_device()  # cuda:local_rank under NCCL
    mesh = Mesh(dp=args.dp, pp=args.pp, tp=args.tp, cp=args.cp, ep=args.ep, etp=args.etp,
                fold=args.fold)
    lead = mesh.rank == 0

    def new_optimizer(tensors):  # what this rank steps: parameters, or ZeRO's shards of them
        return torch.optim.Adam(tensors, lr=args.lr)

    plan = dict(sequence_parallel=args.sp, recompute=args.recompute,
                virtual_stages=args.virtual_stages, zero_stage=args.zero_stage,
                tp_overlap=args.tp_overlap, placement=placement_of(args.schedule),
                vision_layout=args.vision_layout, cp_comm=args.cp_comm,
                cp_a2a_size=args.cp_a2a_size, pipeline_layout=args.pipeline_layout,
                validated=True)  # the parent checked every flag before any rank started
    if uses_mixed_precision(args):
        plan["param_dtype"] = torch.bfloat16
    if args.load:
        model, optimizer, _ = checkpoint.load(  # the routing flags applied; Adam's or Muon's
            args.load, mesh, config=cfg, **optim_flags.load_options(args, new_optimizer), **plan)
    else:
        torch.manual_seed(args.seed)
        model = parallelize(GPT(cfg).to(device, dtype), mesh, **plan, **fp8_plan(args))
        optimizer = optim_flags.make(args, model, mesh, make_optimizer, new_optimizer)
    with save_flags.reported():  # a directory another writer took: one line in the parent
        saver = save_flags.saver_for(args, model, optimizer, mesh, plan)  # with --save-every
    dense = fp8_one_process(GPT(cfg).to(dtype), args)  # on the CPU: evaluation and sampling
    # use the gathered weights (under --fp8 through FP8 casts too: `minitp.train.fp8_flags`)
    if args.pack:
        eval_set = packing.eval_packed_batches(eval_tokens, args.eval_batches, args.batch_size,
                                               cfg.seq_len, args.seed)
    else:
        eval_set = vision_data.eval_batches_for(cfg, eval_tokens, args.eval_batches,
                                                args.batch_size, args.seed)

    def evaluate() -> float:
        # Every rank scores its share of the held-out batches with the dense model,
        # then one all-reduce sums them: it works the same at any (dp, pp, tp).
        with trace.paused():
            with zero.gathered(model):  # stage 3 keeps only shards between steps
                dense.load_state_dict({**model.full_state_dict(),
                                       **checkpoint.dense_expert_biases(model, mesh)})
            total = torch.zeros(2, dtype=torch.float64)
            with torch.no_grad():
                for x, y, *packed in eval_set[mesh.rank::mesh.world_size]:
                    # packed: each batch weighs its counted targets (never its padding)
                    n = int((y != IGNORE_INDEX).sum()) if packed else y.numel()
                    loss = dense(x, y, positions=packed[0] if packed else None)[1]
                    total += torch.tensor([float(loss) * n, n], dtype=torch.float64)
            total = comm.all_reduce(total.to(device), world()).cpu()
        return float(total[0] / total[1])

    bar = None
    if lead and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=start_step, file=console(), unit="step",
                   mininterval=0.5, dynamic_ncols=True)
    losses, evals, seconds, ledger, stopped = [], [], 0.0, None, None
    traced_step = args.steps - 1
    tokens_per_step = args.batch_size * cfg.seq_len
    flops_per_step = calc.model_flops(cfg, args.batch_size)
    for step in range(start_step, args.steps):
        torch.manual_seed(step_seed(args.seed, step))
        batch = tuple(t.to(device) for t in batch_of(args, cfg, train_tokens, step))
        set_lr(optimizer, lr_at(args, step))
        started = time.perf_counter()
        with contextlib.ExitStack() as stack:
            # The trace keeps one step (the last), for its timeline and bytes: every
            # step would be 100k events. The first step's saved activations are counted.
            if step != traced_step or step == start_step:
                stack.enter_context(trace.paused())
            if step == start_step:
                ledger = stack.enter_context(memory.ActivationLedger(model))
            loss = train_step(model, batch, mesh, optimizer, schedule=args.schedule,
                                 microbatches=args.microbatches, clip_grad=args.clip_grad)
        elapsed = time.perf_counter() - started
        seconds += elapsed
        losses.append(loss)
        stopped = _stop_before_save(args, saver, model, optimizer, step + 1, loss)
        if stopped:  # every rank, at the same step (`minitp.train.divergence`)
            break
        with save_flags.reported():  # a full disk, say: one line in the parent
            save_flags.after_step(args, saver, step + 1, mesh.rank)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            evals.append((step + 1, evaluate()))
            if not math.isfinite(evals[-1][1]):  # all-reduced: the same on every rank
                stopped = divergence.eval_stop(step + 1, evals[-1][1])
                break
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
    with save_flags.reported():
        if saver is not None:
            saver.close()  # an asynchronous write still running (a good step's)
        elif args.save and not stopped:
            checkpoint.save(model, args.save, args.steps, optimizer,
                            extra={"seed": args.seed, "lr": args.lr,
                                   "optimizer": args.optimizer})
    result = {"memory": {**memory.measure_model_states(model, optimizer),
                         "activations": ledger.total_bytes if ledger else 0}}
    if stopped:
        result["stopped"] = stopped  # no sample: from weights that are not finite, it crashed
    elif lead:
        result.update(losses=losses, evals=evals, seconds=seconds,
                      tokens_per_s=tokens_per_step * len(losses) / seconds,
                      sample=sample(dense, args.prompt, args.sample_tokens, args.seed,
                                    args.temperature))
    return result


def _stop_before_save(args, saver, model, optimizer, step: int, loss: float) -> str | None:
    """The line that stops the run after `step` (steps taken), or None: a loss that is not
    finite; or, where a checkpoint is written or the run ends (its weights are then
    evaluated, saved and sampled), weights that the step's update made not finite."""
    saving = bool(args.save)
    stop = divergence.loss_stop(step, loss, saving)
    due = step == args.steps or (saver is not None and step % args.save_every == 0)
    if stop is None and due and not divergence.weights_finite(model, optimizer):
        stop = divergence.weights_stop(step, loss, saving)
    return stop


def sample(model: GPT, prompt: str, n: int, seed: int,
           temperature: float = TEMPERATURE) -> str:
    """About `n` bytes continuing `prompt`, drawn at `temperature` from a seeded generator.

    Tokens are bytes, so the model could draw bytes that are not UTF-8 (a
    continuation byte with no lead, a character cut off at the end): each draw
    is restricted to the bytes that keep the text valid UTF-8 (`_utf8_allowed`),
    and sampling goes on past `n` until the last character is whole. The result
    always decodes, with no replacement characters. A vision-language model sees its
    window's first characters drawn before it (`vision_data.prompt_image`; blanks while the
    text is shorter than the picture). A text model decodes through a KV cache
    (`minitp.serving.Decoder`); a VLM's picture changes with its text, so it reruns the window."""
    from ..serving import Decoder

    decoder = None if model.cfg.vision_patches else Decoder(model)
    generator = torch.Generator().manual_seed(seed)
    idx = data.encode(prompt or "\n")[None]  # (1, T)
    window = model.cfg.seq_len - model.cfg.vision_patches  # the text a sequence holds
    pending: list[int] = []  # the bytes of a character begun but not finished
    with torch.no_grad():
        for i in itertools.count():
            if i >= n and not pending:
                break
            text = idx[:, -window:]
            # a VLM is shown, as in training, a picture of its text's first characters
            if decoder is not None:
                logits = decoder.next_logits(idx)[0].double()
            else:
                image = vision_data.prompt_image(model.cfg, bytes(text[0].tolist()))  # (1, P|0)
                logits = model(torch.cat([image, text], dim=1))[0][0, -1].double()
            logits = _tempered(logits, temperature, _utf8_allowed(pending))
            token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
            pending = _utf8_after(pending, token)
            idx = torch.cat([idx, torch.tensor([[token]])], dim=1)
    return bytes(idx[0].tolist()).decode("utf-8")


def _tempered(logits: torch.Tensor, temperature: float, allowed: torch.Tensor) -> torch.Tensor:
    """logits / temperature, the bytes not `allowed` at -inf. Where a tiny temperature
    overflows a logit to inf (softmax then gives NaN), the logits are first shifted so the
    largest allowed one is 0: the same distribution, with no overflow (the shift is taken
    only then, so every other sample stays what it was, bit for bit)."""
    scaled = logits / temperature
    scaled[~allowed] = -math.inf
    if not math.isfinite(float(scaled.max())):
        scaled = (logits - logits[allowed].max()) / temperature
        scaled[~allowed] = -math.inf
    return scaled


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
