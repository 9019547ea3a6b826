"""Multi-head latent attention's rules (`GPTConfig.mla`, `minitp.model.mla`), beside
`minitp.rules`: what its sizes may be, and which parallel axes minitp splits it over. No
torch, so the calculator and `check_parallel_config` may read them."""

from __future__ import annotations

from .sizes import check_positive_int


def check_mla_config(cfg) -> None:
    """A GPTConfig's latent-attention fields (called when any of them is set)."""
    check_positive_int("GPTConfig.kv_lora_rank", cfg.kv_lora_rank)
    check_positive_int("GPTConfig.rope_dim", cfg.rope_dim)
    if cfg.q_lora_rank:
        check_positive_int("GPTConfig.q_lora_rank", cfg.q_lora_rank)
    if cfg.rope_dim % 2:
        raise ValueError(f"rope_dim={cfg.rope_dim} is odd: the rotary key turns pairs of "
                         "features, so rope_dim must be even")
    if cfg.positions != "rope":
        raise ValueError(f"positions={cfg.positions!r} with latent attention: its positions "
                         "are its decoupled rotary key (positions='rope', as GPTConfig.mla sets)")
    if cfg.n_kv_head != cfg.n_head:
        raise ValueError(f"n_kv_head={cfg.n_kv_head} with latent attention: every head "
                         f"up-projects its own K and V from the latent (n_kv_head = "
                         f"n_head = {cfg.n_head})")


def check_mla_parallel(cfg, cp: int, cp_comm: str = "ring") -> None:
    """The axes minitp splits latent attention over: tp (± SP), dp, pp, and cp by gathering
    the latent (cp_comm "allgather": `minitp.context_parallel.latent`) only."""
    if getattr(cfg, "kv_lora_rank", 0) and cp > 1 and cp_comm != "allgather":
        raise ValueError(f"cp_comm={cp_comm!r} with latent attention (kv_lora_rank="
                         f"{cfg.kv_lora_rank}): the ring, the all-to-all and allgather-regather "
                         "move or keep per-head K/V, which it makes only from its latent; use "
                         "cp_comm='allgather' (the latent and rotary key gathered)")
