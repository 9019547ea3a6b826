"""`python -m minitp.generate`'s flags and every check on them, in the parent before any
process starts: one line, exit code 2 (a missing checkpoint, a tp the heads cannot split,
a pp the layers cannot, a prompt longer than the window)."""

from __future__ import annotations

import argparse

import torch

from .. import checkpoint, data
from ..model import GPTConfig
from ..rules import check_parallel_config
from ..train.flags import TEMPERATURE, _Parser


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
    a("--dtype", default="float32", choices=["float32", "float64"],
      help="the weights', activations' and cache's dtype (float64 for an exact --check)")
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
    if args.temperature < 0:
        parser.error(f"--temperature must be at least 0 (0: greedy), got {args.temperature}")
    try:
        cfg = GPTConfig(**checkpoint.read_meta(args.load)["config"])
    except (OSError, ValueError, TypeError) as exc:
        parser.error(f"--load {args.load}: {exc}")
    if cfg.vision_patches:
        parser.error(f"--load {args.load}: a vision-language model's prompt is an image and "
                     "text; minitp.generate serves text models")
    try:
        check_parallel_config(cfg, pp=args.pp, tp=args.tp, world_size=args.pp * args.tp)
    except ValueError as exc:
        parser.error(str(exc))
    prompt = data.encode(args.prompt or "\n")
    if len(prompt) > cfg.seq_len:
        parser.error(f"--prompt is {len(prompt)} tokens, longer than the model's window "
                     f"seq_len={cfg.seq_len}")
    return cfg, prompt


def groups_of(batch: int, pp: int) -> list[int]:
    """The rows of each group of sequences in flight: min(batch, pp) groups, as equal as
    whole rows allow (one group without a pipeline)."""
    n = min(batch, pp)
    return [batch // n + (g < batch % n) for g in range(n)]
