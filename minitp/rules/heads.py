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

