"""What tensor parallelism needs of a layer's widths: whole heads, whole K/V heads (or
whole copies of them), whole MLP features — written once, read by
`minitp.rules.check_parallel_config` and by the tensor-parallel plan."""

from __future__ import annotations


def kv_layout(cfg, tp: int) -> str:
    """How tp ranks hold the K/V heads: "split" (each its own n_kv/tp of them, like the
    query heads: tp divides n_kv) or "replicated" (tp above n_kv and a multiple of it:
    each K/V head serves tp/n_kv ranks, which must then sum its gradient). ValueError
    otherwise."""
    kv = cfg.kv_heads
    if kv % tp == 0:
        return "split"
    if tp % kv == 0:
        return "replicated"
    raise ValueError(f"tp={tp} with n_kv_head={kv}: tp must divide the K/V heads or be a "
                     "multiple of them (a rank's query heads must read whole K/V heads)")


def check_tp_widths(cfg, tp: int) -> None:
    """Every rank the same number of whole heads, K/V heads and MLP features."""
    if cfg.n_head % tp:
        raise ValueError(
            f"n_head={cfg.n_head} is not divisible by tp={tp}: tensor parallelism gives "
            "every rank the same number of whole attention heads"
        )
    if cfg.d_model % tp:
        raise ValueError(f"d_model={cfg.d_model} (the hidden size) is not divisible by tp={tp}")
    ffn = getattr(cfg, "ffn_width", 4 * cfg.d_model)  # (a lesson's sketch of a config has none)
    if ffn % tp:
        raise ValueError(f"the MLP's width {ffn} is not divisible by tp={tp}: "
                         "every rank holds the same number of whole features")
    if getattr(cfg, "n_kv_head", None) is not None:
        kv_layout(cfg, tp)


# How a vision-language model's encoder sits on a tensor-parallel group (`minitp.vision`):
# "replicated" (whole on every rank, as the course's source suggests for a small encoder) or
# "tensor" (its blocks split like the decoder's).
VISION_LAYOUTS = ("replicated", "tensor")


def check_vision_layout(cfg, layout: str, tp: int, cp: int = 1) -> None:
    """A vision encoder's layout over tp, and what a vision-language model refuses."""
    if layout not in VISION_LAYOUTS:
        raise ValueError(f"vision_layout must be one of {VISION_LAYOUTS}, got {layout!r}")
    if not getattr(cfg, "vision_patches", 0):
        return
    if cp > 1:
        raise ValueError(f"cp={cp} with a vision-language model: not built (the encoder needs "
                         "the whole image on a rank, which the load-balanced split cuts up)")
    if layout == "tensor":
        try:
            check_tp_widths(cfg.vision_config, tp)
        except ValueError as err:
            raise ValueError(f"vision_layout='tensor': the vision encoder's {err}") from None
