"""`python -m minitp.train`'s flags and every check on them, run in the parent before
any process starts (argparse's error, exit code 2): the mesh, the schedule, the
checkpoint to load, whether the run fits this machine's memory.
"""

from __future__ import annotations

import argparse
import os

import torch

from .. import checkpoint, data
from ..data import packing
from ..rules import (
    SCHEDULE_NAMES,
    ZERO_STAGES,
    check_packing,
    check_parallel_config,
    check_tp_overlap,
)
from ..rules.cp_comm import CP_COMMS, check_cp_comm_has_cp
from ..rules.experts import BALANCES
from ..rules.schedules import placement_of
from ..rules.vision import VISION_LAYOUTS
from . import model_flags, values
from .fp8_flags import add_fp8_flags, validate_fp8
from .impl_flags import ZERO_STAGE_LEFT_OUT, add_impl_flags, validate_impl
from .layout_flags import add_layout_flag, validate_layout
from .machine import (
    available_memory,
    memory_needed,
    too_big,
    under_torchrun,
    uses_mixed_precision,
    world_size_of,
)
from .model_flags import DTYPE, MODEL_SIZES, capacity_factor
from .model_options import ARCHS, add_mla_flags
from .optim_flags import add_optim_flags, validate_optim
from .save_flags import add_save_flags, validate_save

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
    a("--cp-comm", choices=CP_COMMS, default="ring",
      help="context parallelism's attention (needs --cp > 1): ring (K/V passed round the cp "
           "ranks, default), allgather (K/V gathered once), a2a (Ulysses: an all-to-all "
           "trades the sequence split for a head split), a2a+ring (the all-to-all inside "
           "groups of --cp-a2a-size ranks, the ring across them), allgather-regather "
           "(K/V gathered again in backward: TransformerEngine's)")
    a("--cp-a2a-size", type=int, default=None, metavar="U",
      help="--cp-comm a2a+ring's all-to-all group: U consecutive cp ranks (U divides --cp "
           "and the heads)")
    a("--sp", action=argparse.BooleanOptionalAction, default=True,
      help="sequence parallelism (default on)")
    a("--tp-overlap", action="store_true",
      help="overlap sequence parallelism's all-gathers and reduce-scatters with the GEMMs, "
           "chunk by chunk (needs --sp and --tp > 1)")
    # The model's flags default to None, so that --load can tell a flag given from one left
    # out. With --load the checkpoint fixes the model's tensors: a flag that would change
    # them is refused if it differs, the routing flags apply (`minitp.train.model_flags`).
    a("--arch", choices=ARCHS, default=None, help="gpt2 (default), llama (RMSNorm, rotary "
      "positions, SwiGLU, no biases), vlm (llama reading a rendered image of its text) or mla "
      "(llama with DeepSeek's latent attention); with --load, the checkpoint's")
    add_mla_flags(p)  # --arch mla's sizes (`minitp.train.model_options`)
    a("--vision-layout", choices=VISION_LAYOUTS, default="replicated",
      help="--arch vlm's encoder over tp: whole on every rank (default), or split (tensor)")
    a("--n-kv-head", type=int, default=None, metavar="K", help="--arch llama's K/V heads, "
      "shared by groups of query heads (default: one per query head; 1: multi-query); with "
      "--load, the checkpoint's (another K is refused)")
    a("--experts", type=int, default=None, metavar="E",
      help="a mixture of experts in every layer's MLP place: E experts (default 0: dense); "
           "with --load, the checkpoint's")
    a("--top-k", type=int, default=None, metavar="K",
      help="experts per token (needs --experts; default 2; with --load, the checkpoint's "
           "unless given, and then K applies)")
    a("--ep", type=int, default=1, help="expert-parallel size, folded into dp*cp: each group "
                                        "of ep ranks shares out the experts (default 1)")
    a("--etp", type=int, default=1, help="expert tensor parallelism: each expert's MLP split "
                                         "over etp ranks (implies --fold; default 1)")
    a("--fold", action="store_true", help="MoE parallel folding: the experts factor a stage's "
                                          "dp*cp*tp ranks as etp x ep x edp, so ep may span tp")
    a("--capacity-factor", type=capacity_factor, default=None, metavar="F",
      help="each expert takes at most ceil(F*T*K/E) tokens per sequence, or 'dropless' "
           "(needs --experts; default dropless; with --load, the checkpoint's unless given, "
           "and then F applies)")
    a("--balance", choices=BALANCES, default=None,
      help="load balancing: Switch's aux loss, DeepSeek-V3's expert bias, or none (needs "
           "--experts; default aux; with --load, the checkpoint's unless given, and then it "
           "applies)")
    a("--recompute", choices=("selective", "full"), default=None)
    a("--schedule", choices=SCHEDULE_NAMES, default="1f1b",
      help="the pipeline's order; zb-h1 and zb-h2 split each backward into B and W, zbv and "
           "dualpipev too, on two chunks per rank placed in a V (default 1f1b)")
    a("--zero-stage", type=int, choices=ZERO_STAGES, default=ZERO_STAGE_LEFT_OUT,
      help="ZeRO over the data-parallel axis: 1 shards Adam's state, 2 also the gradients, "
           "3 also the parameters (default 0: none; under --impl torch with --dp > 1, 3: "
           "FSDP2)")
    a("--microbatches", type=int, default=2, help="per data-parallel rank (default 2: the fewest "
                                                  "that still overlap the two stages)")
    a("--virtual-stages", type=int, default=1,
      help="per pipeline rank, for --schedule interleaved (default 1; zbv, dualpipev: 2)")
    add_layout_flag(p)  # --pipeline-layout (`minitp.train.layout_flags`)
    a("--steps", type=int, default=400, help="optimizer steps in all (default 400)")
    a("--seed", type=int, default=0)
    a("--data", metavar="FILE", help="train on this text file instead of the embedded corpus")
    a("--pack", action="store_true",
      help="pack documents (the corpus's files; --data's file is one) into the rows, each "
           "token masked to its own document, positions restarting (minitp.data.packing)")
    a("--out", metavar="DIR", help="run directory (default runs/<timestamp>)")
    a("--trace-out", metavar="FILE", help="the last step's trace (timeline.png's) as a Chrome "
      "trace-event file: open it in https://ui.perfetto.dev or chrome://tracing")
    a("--check", action="store_true",
      help="also train the single-process GPT on the same batches; report the largest "
           "loss difference")
    a("--save", metavar="DIR", help="write a checkpoint here at the end (with --save-every: "
      "sharded ones, periodically)")
    a("--load", metavar="DIR", help="resume from this checkpoint (it fixes the model: a size, "
      "--arch, --n-kv-head, --experts or --dtype that differs is refused; --top-k, "
      "--capacity-factor, --balance apply; --steps is the total, counting the steps done)")
    add_save_flags(p)
    for flag, default in MODEL_SIZES.items():
        a(f"--{flag}", type=int, default=None, help=f"(default {default}; with --load, the "
                                                    "checkpoint's)")
    a("--batch-size", type=int, default=64, help="global batch, in sequences (default 64)")
    a("--lr", type=float, default=2e-3, help="the peak learning rate: Adam's, or under "
                                              "--optimizer muon Muon's and AdamW's (default 2e-3)")
    a("--clip-grad", type=float, default=None, metavar="NORM",
      help="clip the gradients' global norm (over the whole mesh) to NORM (default: none)")
    a("--warmup", type=int, default=0, help="steps of linear warm-up to --lr (default 0)")
    a("--lr-schedule", choices=("cosine", "constant"), default="constant",
      help="after warm-up: cosine decay to a tenth of --lr at --lr-decay-steps, or "
           "constant (default constant: over the default 400 steps a cosine measured worse)")
    a("--lr-decay-steps", type=int, default=None, metavar="N",
      help="the step where the cosine ends (default --steps; give the same N to a run "
           "and to its resumed continuation so both follow one schedule)")
    a("--dtype", choices=("float32", "float64", "bfloat16"), default=None,
      help=f"bfloat16: mixed precision (bf16 parameters and activations, float32 gradients "
           f"and master weights; --check then compares with a float64 reference; default "
           f"{DTYPE}; with --load, the checkpoint's)")
    a("--eval-every", type=int, default=40, help="steps between evaluations (default 40)")
    a("--eval-batches", type=int, default=8)
    a("--sample-tokens", type=int, default=200, help="bytes of text sampled at the end")
    a("--temperature", type=float, default=TEMPERATURE,
      help="sampling temperature: lower is more repetitive, higher more random "
           f"(default {TEMPERATURE})")
    a("--prompt", default="def ")
    a("--timeout", type=float, default=300.0, help="seconds a rank may wait in a collective")
    a("--no-progress", action="store_true", help="no progress bar")
    add_fp8_flags(p)
    add_impl_flags(p)  # --impl torch, --hsdp (`minitp.train.impl_flags`)
    add_optim_flags(p)  # --optimizer muon, --muon-strategy (`minitp.train.optim_flags`)
    return p


def validate(args, parser):
    """Every check that can fail before a process starts; parser.error (exit 2) if one does.
    Returns (cfg, train_tokens, eval_tokens, start_step); with --pack, the tokens are
    lists of documents (`minitp.data.packing`).

    The rules of the split (what must divide what, which schedule fits which
    virtual stages and microbatches, how the batch is cut) are
    `minitp.rules.check_parallel_config`'s, given every flag they involve, so a
    run that `train_step` would refuse on every rank is refused here, once."""
    validate_impl(args, parser)  # --impl torch: what torch's path cannot run, refused first
    for name in ("dp", "pp", "cp", "tp", "ep", "etp", "top_k", "microbatches", "virtual_stages",
                 "steps", "batch_size", "eval_every", "eval_batches", "cp_a2a_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:  # None: left out
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:  # before the model is built: the flags alone say it
        check_cp_comm_has_cp(args.cp, args.cp_comm, args.cp_a2a_size, flags=True)
    except ValueError as exc:
        parser.error(str(exc))
    if placement_of(args.schedule) == "v" and args.virtual_stages == 1:  # implied by a V
        args.virtual_stages = 2
    try:  # nan, inf, a seed past int64, a prompt or a place that the run could not use
        values.check_numbers(args)
        values.check_text_and_places(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.warmup < 0:
        parser.error(f"--warmup must be at least 0, got {args.warmup}")
    if args.lr_decay_steps is not None and args.lr_decay_steps < 1:
        parser.error(f"--lr-decay-steps must be at least 1, got {args.lr_decay_steps}")
    validate_save(args, parser)  # args.load: the checkpoint --load means (or None)
    validate_optim(args, parser)  # --optimizer muon: what it cannot pair with; --load's state
    start_step = 0
    if args.load:
        try:
            meta = checkpoint.read_meta(args.load)
        except (OSError, ValueError) as exc:
            parser.error(f"--load: {exc}")
        start_step = meta["step"]
        if args.steps <= start_step:
            parser.error(f"--steps {args.steps}: the checkpoint is already at step {start_step}")
        try:
            cfg = model_flags.config_from_checkpoint(args, meta)  # fixed refused, routing used
        except ValueError as exc:
            parser.error(str(exc))
    else:
        try:
            cfg = model_flags.new_model_config(args)  # defaults; MoE's flags need --experts
        except ValueError as exc:
            parser.error(str(exc))
    model_flags.record_config(args, cfg)  # args now say what runs: metrics.json records them
    try:
        values.check_lr_fits(args)  # in the dtype the run now has (--load's, say)
    except ValueError as exc:
        parser.error(str(exc))
    validate_layout(args, cfg, parser)  # before the rules: its message names the flag
    world = world_size_of(args)
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != world:
        product = "dp*pp*cp*tp" if args.cp > 1 else "dp*pp*tp"
        parser.error(f"torchrun started {os.environ['WORLD_SIZE']} processes but "
                     f"{product} = {world}")
    try:
        check_parallel_config(cfg, dp=args.dp, pp=args.pp, tp=args.tp, cp=args.cp,
                              sequence_parallel=args.sp, recompute=args.recompute,
                              virtual_stages=args.virtual_stages, world_size=world,
                              schedule=args.schedule, microbatches=args.microbatches,
                              batch_size=args.batch_size, zero_stage=args.zero_stage,
                              param_dtype="bfloat16" if uses_mixed_precision(args) else None,
                              ep=args.ep, tp_overlap=args.tp_overlap and args.sp and args.tp > 1,
                              placement=placement_of(args.schedule),
                              vision_layout=args.vision_layout, cp_comm=args.cp_comm,
                              cp_a2a_size=args.cp_a2a_size, pipeline_layout=args.pipeline_layout,
                              etp=args.etp, fold=args.fold)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        check_tp_overlap(args.tp_overlap, args.sp, args.tp)
    except ValueError as exc:
        parser.error(f"--tp-overlap (--sp, --tp): {exc}")
    validate_fp8(args, parser, cfg)
    if uses_mixed_precision(args) and (args.save or args.load):
        parser.error("--dtype bfloat16 with --save/--load: checkpoints of a mixed-precision run "
                     "would lose its float32 master weights, so minitp does not write them yet")
    need = memory_needed(args, cfg)
    text = values.rank_data_bytes(args, cfg)  # every rank's copy of the text, held-out batches
    need = dict(need, per_rank=need["per_rank"] + text,
                machine=need["machine"] + text * need["ranks"])
    refusal = too_big(need, available_memory(),
                      "a model: minitp.calc's parameters, gradients, Adam state and "
                      "activations, plus each rank's dense copy, text and held-out batches",
                      "try a smaller --d-model, --n-layer, --seq-len, --batch-size or "
                      "--eval-batches")
    if refusal:
        parser.error(refusal)
    if args.save:
        try:  # now, not after the whole run has trained
            checkpoint.check_save_target(args.save)
        except OSError as exc:
            parser.error(f"--save: {exc}")
    if args.pack:
        try:
            check_packing(cfg.vision_patches)
        except ValueError as exc:
            parser.error(f"--pack: {exc}")
        documents = ([data.load_tokens(args.data)] if args.data
                     else packing.corpus_documents())
        train_tokens, eval_tokens = packing.split_documents(documents)
        whole = [torch.cat(docs) if docs else torch.zeros(0) for docs in (train_tokens,
                                                                           eval_tokens)]
    else:
        train_tokens, eval_tokens = data.split(data.load_tokens(args.data))
        whole = [train_tokens, eval_tokens]
    try:
        data.check_length(whole[0], cfg.seq_len, "training split")
        data.check_length(whole[1], cfg.seq_len, "held-out split (the last 5%)")
    except ValueError as exc:
        parser.error(f"{args.data or 'the corpus'}: {exc}")
    return cfg, train_tokens, eval_tokens, start_step


def sizes_text(args) -> str:
    return (f"dp={args.dp} pp={args.pp} " + (f"cp={args.cp} " if args.cp > 1 else "")
            + f"tp={args.tp}" + (f" ep={args.ep}" if args.ep > 1 else "")
            + (f" etp={args.etp}" if args.etp > 1 else "") + (" fold" if args.fold else ""))
