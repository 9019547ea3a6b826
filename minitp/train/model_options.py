"""GPTConfig's fields from the command line's model flags: the architecture (--arch,
--n-kv-head) and the mixture of experts (--experts and its options)."""

from __future__ import annotations

from ..config import LLAMA_PARTS

ARCHS = ("gpt2", "llama")


def arch_options(args) -> dict:
    """GPT-2's parts (--arch gpt2, the default: none to set) or the Llama-style ones, with
    --n-kv-head K/V heads (default: one per query head)."""
    if args.arch in (None, "gpt2"):
        if args.n_kv_head is not None:
            raise ValueError("--n-kv-head needs --arch llama (GPT-2's attention has one K/V "
                             "head per query head)")
        return {}
    return dict(LLAMA_PARTS, n_kv_head=args.n_head if args.n_kv_head is None else args.n_kv_head)


def moe_options(args) -> dict:
    """GPTConfig's mixture-of-experts fields from the flags (none without --experts)."""
    if args.experts < 0:
        raise ValueError(f"--experts must be at least 0, got {args.experts}")
    if not args.experts:
        return {}
    return dict(n_experts=args.experts, top_k=args.top_k,
                capacity_factor=args.capacity_factor, balance=args.balance)
