"""What tensor parallelism needs of a layer's widths: whole heads, whole K/V heads (or
whole copies of them), whole MLP features; and what Ulysses' all-to-all needs of a tp
rank's heads after it — written once, read by `minitp.rules.check_parallel_config`, the
tensor-parallel plan and context parallelism's all-to-all."""

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



def kv_heads_per_rank(cfg, tp: int) -> int:
    """The K/V heads one tp rank's attention core receives: n_kv/tp where tp splits them,
    one where tp replicates them (`kv_layout`)."""
    return cfg.kv_heads // tp if kv_layout(cfg, tp) == "split" else 1


def ulysses_kv_layout(cfg, tp: int, ulysses: int) -> str:
    """How the `ulysses` ranks of an all-to-all (Ulysses) group hold a tp rank's K/V heads
    once the all-to-all has given each rank 1/ulysses of the query heads: "split" (ulysses
    divides the tp rank's K/V heads, each rank its own share of them) or "replicated"
    (ulysses a multiple of them: each K/V head copied to the ulysses/n_kv ranks whose
    query heads read it, their gradients summed back). ValueError otherwise."""
    kv = kv_heads_per_rank(cfg, tp)
    if kv % ulysses == 0:
        return "split"
    if ulysses % kv == 0:
        return "replicated"
    raise ValueError(f"n_kv_head={cfg.kv_heads} over tp={tp} leaves {kv} K/V heads per rank: "
                     f"the all-to-all over {ulysses} ranks must divide them or be a multiple "
                     "of them (each rank's query heads must read whole K/V heads)")


def check_ulysses_heads(cfg, tp: int, ulysses: int) -> None:
    """Ulysses (all-to-all context parallelism) gives each of `ulysses` ranks whole query
    heads of a tp rank's n_head/tp, and whole K/V heads or whole copies of them."""
    heads = cfg.n_head // tp
    if heads % ulysses:
        raise ValueError(f"n_head={cfg.n_head} over tp={tp} leaves {heads} heads per rank, "
                         f"not divisible by the all-to-all's {ulysses} ranks: Ulysses gives "
                         "each rank whole attention heads")
    ulysses_kv_layout(cfg, tp, ulysses)
