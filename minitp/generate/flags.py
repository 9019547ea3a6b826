"""`python -m minitp.generate`'s flags and every check on them, in the parent before any
process starts: one line, exit code 2 (a missing checkpoint, a tp the heads cannot split,
a pp the layers cannot, a prompt longer than the window or not UTF-8, a temperature, seed
or timeout the ranks could not use, a batch this machine's memory cannot hold)."""

from __future__ import annotations

import argparse

import torch

from .. import checkpoint, data
from ..model import GPTConfig
from ..rules import check_parallel_config, check_timeout
from ..serving.sampling import check_seed, check_temperature
from ..train.flags import TEMPERATURE, _Parser
from ..train.machine import available_memory, too_big
from .memory import memory_needed

DTYPES = ("float32", "float64")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m minitp.generate",
                description="Generate text from a checkpoint saved by python -m minitp.train "
                            "(at any layout), over tensor and pipeline ranks, through a KV cache.")
    a = p.add_argument
    a("--load", required=True, metavar="DIR", help="the checkpoint directory (--save's)")
    a("--tp", type=int, default=1, help="tensor-parallel size: heads and their cache split")
    a("--pp", type=int, default=1, help="pipeline stages: the layers split, the batch cut into "
                                        "min(batch, pp) groups in flight")
    a("--batch", type=int, default=1, help="sequences generated at once, each from --prompt")
    a("--tokens", type=int, default=32, help="tokens to generate after the prompt (default 32)")
    a("--prompt", default="def ", help="the text to continue (bytes are tokens)")
    a("--temperature", type=float, default=TEMPERATURE,
      help=f"0: greedy; else softmax(logits/T) drawn, group g from seed+g (default {TEMPERATURE})")
    a("--seed", type=int, default=0)
    a("--dtype", default=None, choices=DTYPES,
      help="the weights', activations' and cache's dtype (default: the checkpoint's; "
           "float64 for an exact --check)")
    a("--check", action="store_true",
      help="compare tokens and logits with one uncached process; last line's max_logit_diff")
    a("--timeout", type=float, default=300.0, help="seconds a rank may wait in a collective")
    return p


def validate(args, parser) -> tuple[GPTConfig, torch.Tensor]:
    """Every check that can fail before a process starts; returns (the checkpoint's config,
    the prompt's ids (T,))."""
    for name in ("tp", "pp", "batch", "tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    for flag, check, value in (("--temperature", check_temperature, args.temperature),
                               ("--timeout", check_timeout, args.timeout),
                               ("--seed", check_seed, args.seed)):
        try:  # the library's own rules, so the ranks would not refuse what passes here
            check(value)
        except ValueError as exc:
            parser.error(f"{flag}: {exc}")
    last = len(groups_of(args.batch, args.pp)) - 1  # group g draws from seed + g
    try:
        check_seed(args.seed + last)
    except ValueError:
        parser.error(f"--seed {args.seed}: the last of the pipeline's groups draws from "
                     f"seed + {last}, past the largest seed a generator takes (2**64 - 1)")
    try:
        meta = checkpoint.read_meta(args.load)
        cfg = GPTConfig(**meta["config"])
    except (OSError, ValueError, TypeError) as exc:
        parser.error(f"--load {args.load}: {exc}")
    if args.dtype is None:  # the checkpoint's: its --check then compares like with like
        args.dtype = meta.get("dtype") if meta.get("dtype") in DTYPES else DTYPES[0]
    if cfg.vision_patches:
        parser.error(f"--load {args.load}: a vision-language model's prompt is an image and "
                     "text; minitp.generate serves text models")
    try:
        check_parallel_config(cfg, pp=args.pp, tp=args.tp, world_size=args.pp * args.tp)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        prompt = data.encode(args.prompt or "\n")
    except UnicodeEncodeError as exc:  # argv's undecodable bytes arrive as surrogates
        parser.error(f"--prompt is not UTF-8 text ({exc.reason} at character {exc.start}): "
                     "its bytes are the tokens, so give it as UTF-8")
    if prompt.numel() and int(prompt.max()) >= cfg.vocab_size:  # a byte the model has no row for
        parser.error(f"--prompt holds byte {int(prompt.max())}, outside the model's vocabulary "
                     f"(vocab_size={cfg.vocab_size})")
    if len(prompt) > cfg.seq_len:
        parser.error(f"--prompt is {len(prompt)} tokens, longer than the model's window "
                     f"seq_len={cfg.seq_len}")
    refusal = too_big(memory_needed(args, cfg), available_memory(),
                      "a model: the weights, KV cache, one forward and every step's logits "
                      "(minitp.generate.memory)", "try a smaller --batch or --tokens")
    if refusal:
        parser.error(refusal)
    return cfg, prompt


def groups_of(batch: int, pp: int) -> list[int]:
    """The rows of each group of sequences in flight: min(batch, pp) groups, as equal as
    whole rows allow (one group without a pipeline)."""
    n = min(batch, pp)
    return [batch // n + (g < batch % n) for g in range(n)]
