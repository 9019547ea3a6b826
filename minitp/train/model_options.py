"""GPTConfig's fields from the command line's model flags: the architecture (--arch,
--n-kv-head; --arch mla's sizes, --kv-lora-rank, --q-lora-rank, --rope-dim) and the mixture
of experts (--experts and its options)."""

from __future__ import annotations

from ..model.config import LLAMA_PARTS, GPTConfig
from ..rules import default_vision_patches

ARCHS = ("gpt2", "llama", "vlm", "mla")
# --arch mla's sizes: GPTConfig's fields; left out, `GPTConfig.mla`'s defaults (DeepSeek-V2's
# ratios: d_c = 4·d_h, d_h^R = d_h/2 made even, no query latent; 64, 8, 0 at the default model)
MLA_SIZES = ("kv_lora_rank", "q_lora_rank", "rope_dim")


def add_mla_flags(parser) -> None:
    """--kv-lora-rank, --q-lora-rank, --rope-dim: --arch mla's sizes (`GPTConfig.mla`)."""
    for name, what in (("kv_lora_rank", "d_c, the K/V latent a token caches (default 4·d_h)"),
                       ("q_lora_rank", "the query's latent (default 0: none, V2-Lite's)"),
                       ("rope_dim", "d_h^R, the decoupled rotary key shared by the heads, even "
                                    "(default d_h/2)")):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None, metavar="N",
                            help=f"--arch mla's {what}; with --load, the checkpoint's")


def mla_given(args) -> dict:
    """The --arch mla sizes given on the command line, as GPTConfig's fields."""
    return {n: getattr(args, n) for n in MLA_SIZES if getattr(args, n, None) is not None}


def arch_options(args) -> dict:
    """GPT-2's parts (--arch gpt2, the default: none to set) or the Llama-style ones, with
    --n-kv-head K/V heads (default: one per query head); --arch vlm: a Llama-style decoder
    reading an image of half its sequence first (`GPTConfig.vlm`); --arch mla: latent
    attention in a Llama-style layer, its sizes given or `GPTConfig.mla`'s defaults."""
    given = mla_given(args)
    if given and args.arch != "mla":
        flag = "--" + next(iter(given)).replace("_", "-")
        raise ValueError(f"{flag} needs --arch mla (only latent attention has a latent)")
    if args.arch != "vlm" and args.vision_layout != "replicated":
        raise ValueError("--vision-layout needs --arch vlm (only it has a vision encoder)")
    if args.arch in (None, "gpt2"):
        if args.n_kv_head is not None:
            raise ValueError("--n-kv-head needs --arch llama or vlm (GPT-2's attention has one "
                             "K/V head per query head)")
        return {}
    if args.arch == "mla":
        if args.n_kv_head is not None:
            raise ValueError(f"--n-kv-head {args.n_kv_head} with --arch mla: every head "
                             "up-projects its own K and V from the latent; leave it out")
        sizes = GPTConfig.mla(d_model=args.d_model, n_head=args.n_head, **given)  # defaults
        return dict(LLAMA_PARTS, n_kv_head=args.n_head,
                    **{name: getattr(sizes, name) for name in MLA_SIZES})
    options = dict(LLAMA_PARTS, n_kv_head=args.n_head if args.n_kv_head is None
                   else args.n_kv_head)
    if args.arch == "vlm":
        options["vision_patches"] = default_vision_patches(args.seq_len)
        if not options["vision_patches"]:
            raise ValueError(f"--arch vlm with --seq-len {args.seq_len}: the image takes half "
                             "the sequence in whole characters of 4 patches; give --seq-len 8 "
                             "or more")
    return options


def check_mla_against(args, cfg) -> None:
    """With --load: an --arch mla size given must be the checkpoint's (it fixes the latent's
    weights); ValueError, one line."""
    for name, value in mla_given(args).items():
        if value != getattr(cfg, name):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {value}: the checkpoint's model has {getattr(cfg, name)} "
                             f"(it fixes the latent's weights; leave {flag} out)")


def moe_options(args) -> dict:
    """GPTConfig's mixture-of-experts fields from the flags (none without --experts)."""
    if args.experts < 0:
        raise ValueError(f"--experts must be at least 0, got {args.experts}")
    if not args.experts:
        return {}
    if args.arch in ("llama", "vlm", "mla"):  # GPTConfig's own message names its mlp field
        raise ValueError(f"--experts with --arch {args.arch}: minitp's experts are GPT-2's GELU "
                         "MLPs (a SwiGLU expert is not built); use --arch gpt2")
    return dict(n_experts=args.experts, top_k=args.top_k,
                capacity_factor=args.capacity_factor, balance=args.balance)
