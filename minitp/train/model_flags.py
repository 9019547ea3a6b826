"""Every model flag of `python -m minitp.train` is used or refused, never ignored.

A new model takes each flag left out from its default (`new_model_config`); a mixture of
experts' flags without --experts are refused, since a dense model has no router.

With --load the checkpoint's tensors are the model (`config_from_checkpoint`). A flag
that would change a tensor's shape or type cannot be applied to them: the sizes,
--arch, --n-kv-head (the K/V projections' shapes), --experts, --dtype (the weights
resume as saved). Each may be left out or repeated; a different value is refused in
one line ("leave ... out"). The routing flags --top-k, --capacity-factor and --balance
change no tensor in the files (the router's weights are E×d whatever k; the expert
bias is saved under every balance, zeros unless it was "bias") and are choices a
resumed run may change, so a flag given is applied, to the ranks' model and to
--check's reference alike: a capacity limit tried on a dropless model, or the bias
frozen by --balance none as DeepSeek-V3 does for its last tokens. The checkpoint the
resumed run saves records the routing it ran with.

Afterwards `record_config` writes into ``args`` what runs (the checkpoint's sizes, the
routing applied), so that metrics.json's ``args`` never shows a value that was not used.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from ..data import VOCAB_SIZE
from ..model import GPTConfig
from .model_options import MLA_SIZES, arch_options, check_mla_against, moe_options

MODEL_SIZES = {"n-layer": 4, "d-model": 64, "n-head": 4, "seq-len": 64}  # the defaults
ROUTING = ("top_k", "capacity_factor", "balance")  # applied on --load (the docstring)
DROPLESS = "dropless"  # --capacity-factor's word for None: no capacity limit
DTYPE = "float32"  # --dtype's default for a new model


def capacity_factor(text: str):
    """--capacity-factor's type: a finite number F (GPTConfig refuses F <= 0), or "dropless"
    (no limit); inf once reached a rank's ceil(F*T*K/E) as an OverflowError."""
    if text == DROPLESS:
        return DROPLESS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a finite number nor "
                                         f"{DROPLESS!r}")
    return value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _routing_given(args) -> dict:
    """The routing flags given on the command line, as GPTConfig's fields."""
    given = {name: getattr(args, name) for name in ROUTING if getattr(args, name) is not None}
    if given.get("capacity_factor") == DROPLESS:
        given["capacity_factor"] = None
    return given


def new_model_config(args) -> GPTConfig:
    """Without --load: the GPTConfig of the flags, each left out at its default; a routing
    flag without --experts refused (ValueError, one line, for any refusal)."""
    if args.experts is None:
        args.experts = 0
    for name in ROUTING:
        if not args.experts and getattr(args, name) is not None:
            raise ValueError(f"{_flag(name)} {getattr(args, name)}: a dense model has no "
                             f"router to set; add --experts E for a mixture of E experts")
    for flag, default in MODEL_SIZES.items():
        if getattr(args, flag.replace("-", "_")) is None:
            setattr(args, flag.replace("-", "_"), default)
    if args.dtype is None:
        args.dtype = DTYPE
    if args.experts:  # GPTConfig's defaults for the routing left out
        routing = {name: getattr(GPTConfig, name) for name in ROUTING} | _routing_given(args)
        for name, value in routing.items():
            setattr(args, name, value)
    return GPTConfig(vocab_size=VOCAB_SIZE, n_layer=args.n_layer, d_model=args.d_model,
                     n_head=args.n_head, seq_len=args.seq_len, **arch_options(args),
                     **moe_options(args))


def config_from_checkpoint(args, meta: dict) -> GPTConfig:
    """With --load: the checkpoint's GPTConfig with the routing flags given applied;
    ValueError, one line, for a flag that contradicts what the checkpoint fixes."""
    cfg = GPTConfig(**meta["config"])
    for flag in MODEL_SIZES:
        given, saved = getattr(args, flag.replace("-", "_")), getattr(cfg, flag.replace("-", "_"))
        if given is not None and given != saved:
            raise ValueError(f"--{flag} {given}: the checkpoint's model has {saved} (its sizes "
                             f"are the run's; leave --{flag} out)")
    if args.arch is not None and args.arch != cfg.arch:
        raise ValueError(f"--arch {args.arch}: the checkpoint's model is {cfg.arch} (leave "
                         "--arch out)")
    if args.n_kv_head is not None and args.n_kv_head != cfg.n_kv_head:
        held = (f"has {cfg.n_kv_head} K/V heads" if cfg.n_kv_head is not None else
                f"is {cfg.arch}, one K/V head per query head")
        raise ValueError(f"--n-kv-head {args.n_kv_head}: the checkpoint's model {held} (they "
                         "fix its attention's weights; leave --n-kv-head out)")
    check_mla_against(args, cfg)
    if args.experts is not None and args.experts != cfg.n_experts:
        raise ValueError(f"--experts {args.experts}: the checkpoint's model has "
                         f"{cfg.n_experts} (leave --experts out)")
    if args.dtype not in (None, "bfloat16", meta["dtype"]):  # bfloat16: flags.validate's
        raise ValueError(f"--dtype {args.dtype}: the checkpoint's weights are {meta['dtype']} "
                         "and resume so (leave --dtype out)")
    args.dtype = args.dtype or meta["dtype"]
    routing = _routing_given(args)
    if routing and not cfg.n_experts:
        name = next(iter(routing))
        raise ValueError(f"{_flag(name)} {getattr(args, name)}: the checkpoint's model is "
                         f"dense, with no router to set (leave {_flag(name)} out)")
    return replace(cfg, **routing)  # GPTConfig checks them again (top_k <= n_experts, ...)


def record_config(args, cfg: GPTConfig) -> None:
    """Write into args the model flags as they run: what metrics.json's ``args`` shows."""
    for flag in MODEL_SIZES:
        setattr(args, flag.replace("-", "_"), getattr(cfg, flag.replace("-", "_")))
    args.arch, args.n_kv_head, args.experts = cfg.arch, cfg.n_kv_head, cfg.n_experts
    for name in MLA_SIZES:  # --arch mla's sizes as they run (None for another attention)
        setattr(args, name, getattr(cfg, name) if cfg.kv_lora_rank else None)
    for name in ROUTING:
        setattr(args, name, getattr(cfg, name) if cfg.n_experts else None)
    if cfg.n_experts and cfg.capacity_factor is None:
        args.capacity_factor = DROPLESS
