"""The mixture of experts' rules, beside `minitp.rules` (whose validator calls
`check_expert_parallel`): what a GPTConfig's MoE fields may be, and what expert
parallelism needs of the mesh. No torch and no other import, so the calculator and
`minitp.rules` may read them."""

from __future__ import annotations

# how the router scores (`minitp.model.routing`), how the load is balanced
ROUTERS = ("softmax", "sigmoid")
BALANCES = ("aux", "bias", "none")


def check_moe_config(cfg) -> None:
    """A GPTConfig's mixture-of-experts fields (called when n_experts > 0, once the
    sizes n_experts, top_k and moe_every are known to be positive ints)."""
    if cfg.top_k > cfg.n_experts:
        raise ValueError(f"top_k={cfg.top_k} is more than n_experts={cfg.n_experts}: a token "
                         "cannot go to more experts than there are")
    if cfg.capacity_factor is not None and not cfg.capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0 (or None: dropless), got "
                         f"{cfg.capacity_factor}")
    if cfg.router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {cfg.router!r}")
    if cfg.balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {cfg.balance!r}")
    for name in ("aux_loss_coef", "bias_update_rate"):
        if not getattr(cfg, name) >= 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.dropout > 0:
        raise ValueError(f"dropout={cfg.dropout} with n_experts={cfg.n_experts}: minitp's "
                         "mixture-of-experts layers have no dropout; use dropout=0.0")


def check_expert_parallel(cfg, ep: int, dp: int, cp: int) -> None:
    """What expert parallelism needs: experts to shard, and ep dividing both the experts
    and the data-parallel ranks it is folded into (dp·cp: `minitp.expert_parallel`).
    `ep` is a positive int (`minitp.rules.check_parallel_config` checked it)."""
    if ep == 1:
        return
    if not cfg.n_experts:
        raise ValueError(f"ep={ep} needs a mixture of experts (n_experts > 0) to shard")
    if cfg.n_experts % ep:
        raise ValueError(f"n_experts={cfg.n_experts} is not divisible by ep={ep}: every "
                         "expert-parallel rank holds the same number of whole experts")
    check_ep_divides_dp_cp(ep, dp, cp)


def check_ep_divides_dp_cp(ep: int, dp: int, cp: int) -> None:
    """Expert parallelism is folded into the data-parallel ranks: dp·cp of them, cut into
    runs of ep (the mesh's "ep" groups)."""
    if (dp * cp) % ep:
        raise ValueError(f"ep={ep} does not divide dp*cp={dp * cp}: expert parallelism is "
                         "folded into the data-parallel ranks (each group of ep of them "
                         "shares out the experts)")
