"""GPTConfig's fields from the command line's model flags: the architecture (--arch,
--n-kv-head) and the mixture of experts (--experts and its options)."""

from __future__ import annotations

from ..model.config import LLAMA_PARTS
from ..rules import default_vision_patches

ARCHS = ("gpt2", "llama", "vlm")


def arch_options(args) -> dict:
    """GPT-2's parts (--arch gpt2, the default: none to set) or the Llama-style ones, with
    --n-kv-head K/V heads (default: one per query head); --arch vlm: a Llama-style decoder
    reading an image of half its sequence first (`GPTConfig.vlm`)."""
    if args.arch != "vlm" and args.vision_layout != "replicated":
        raise ValueError("--vision-layout needs --arch vlm (only it has a vision encoder)")
    if args.arch in (None, "gpt2"):
        if args.n_kv_head is not None:
            raise ValueError("--n-kv-head needs --arch llama or vlm (GPT-2's attention has one "
                             "K/V head per query head)")
        return {}
    options = dict(LLAMA_PARTS, n_kv_head=args.n_head if args.n_kv_head is None
                   else args.n_kv_head)
    if args.arch == "vlm":
        options["vision_patches"] = default_vision_patches(args.seq_len)
        if not options["vision_patches"]:
            raise ValueError(f"--arch vlm with --seq-len {args.seq_len}: the image takes half "
                             "the sequence in whole characters of 4 patches; give --seq-len 8 "
                             "or more")
    return options


def moe_options(args) -> dict:
    """GPTConfig's mixture-of-experts fields from the flags (none without --experts)."""
    if args.experts < 0:
        raise ValueError(f"--experts must be at least 0, got {args.experts}")
    if not args.experts:
        return {}
    if args.arch in ("llama", "vlm"):  # GPTConfig's own message names its mlp field
        raise ValueError(f"--experts with --arch {args.arch}: minitp's experts are GPT-2's GELU "
                         "MLPs (a SwiGLU expert is not built); use --arch gpt2")
    return dict(n_experts=args.experts, top_k=args.top_k,
                capacity_factor=args.capacity_factor, balance=args.balance)
