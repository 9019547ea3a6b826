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


def check_expert_parallel(cfg, ep: int, dp: int, cp: int, tp: int = 1, etp: int = 1,
                          fold: bool = False) -> None:
    """What expert parallelism needs: experts to shard, ep dividing them, etp dividing
    each expert's hidden width, and the expert mesh fitting the ranks
    (`check_expert_mesh`). `ep`, `etp` are positive ints (`check_parallel_config`)."""
    if ep == 1 and etp == 1:
        return
    if not cfg.n_experts:
        asked = f"ep={ep}" + (f", etp={etp}" if etp > 1 else "")
        raise ValueError(f"{asked} needs a mixture of experts (n_experts > 0) to shard")
    if cfg.n_experts % ep:
        raise ValueError(f"n_experts={cfg.n_experts} is not divisible by ep={ep}: every "
                         "expert-parallel rank holds the same number of whole experts")
    check_expert_mesh(ep, dp, cp, tp, etp, fold)
    if (4 * cfg.d_model) % etp:
        raise ValueError(f"the experts' hidden width 4*d_model={4 * cfg.d_model} is not "
                         f"divisible by etp={etp}: each etp rank holds an equal slice of it")


def folded(etp: int, fold: bool) -> bool:
    """Whether the experts have their own factorisation of the ranks (Megatron's
    "parallel folding"): asked for, or implied by expert tensor parallelism (etp > 1
    exists only there)."""
    return bool(fold) or etp > 1


def check_expert_mesh(ep: int, dp: int, cp: int, tp: int = 1, etp: int = 1,
                      fold: bool = False) -> None:
    """Which (ep, etp) a (dp, cp, tp) stage allows — the one rule; `expert_meshes` lists them.

    * unfolded (today's default, DeepSpeed-MoE's layout): ep ⊂ dp·cp, experts whole over
      tp, etp = 1 (`check_ep_divides_dp_cp`);
    * folded (``fold=True``, or etp > 1): the experts factor the stage's same ranks their
      own way, etp × ep × edp = tp × cp × dp (Megatron-Core's MoE "parallel folding",
      arXiv 2504.14960; DeepSpeed PR #8064's ``tp·dp = ep·etp·edp``), so ep·etp must
      divide dp·cp·tp and edp is the quotient. ep may span tp and cp.

    torchtitan asks more: EP ≥ TP, and no expert TP. PR #3167 ("deprecate expert tensor
    parallel (ETP)") removed ETP: fine-grained experts are already thin, and split over
    tp their GEMMs get too small to run well; and its ETP had every tp rank of an ep
    group send the same all-to-all (discussion on PR #2842). PR #4794 ("Deprecate pure
    TP on routed experts") then required the expert-parallel degree to be at least the
    dense tp degree, keeping the routed experts' tokens sequence-sharded under EP so that
    no routed token's expert work is repeated over tp (the shared expert stays
    tensor-parallel). minitp keeps etp > 1 and ep < tp runnable: they are what the
    comparison is about (`minitp.calc.folding_bytes`), and its etp ranks each send only
    their own tokens' all-to-all before gathering over etp (Megatron-Core's order).
    """
    if not folded(etp, fold):
        check_ep_divides_dp_cp(ep, dp, cp)
        return
    if (dp * cp * tp) % (ep * etp):
        raise ValueError(f"ep*etp={ep}*{etp}={ep * etp} does not divide dp*cp*tp="
                         f"{dp}*{cp}*{tp}={dp * cp * tp}: folded experts factor a pipeline "
                         "stage's ranks as etp x ep x edp")


def check_folded_slice(seq_len: int, tp: int, cp: int, sequence_parallel: bool,
                       etp: int = 1, fold: bool = False) -> None:
    """Folded without sequence parallelism, each tp rank routes its own contiguous 1/tp of
    the sequence it holds (seq_len/cp of it): that must cut evenly."""
    if folded(etp, fold) and tp > 1 and not sequence_parallel and (seq_len // cp) % tp:
        raise ValueError(f"seq_len={seq_len} (/cp={cp}) cannot be cut into tp={tp} equal "
                         "slices: folded experts route a 1/tp slice of the sequence each")


def expert_meshes(dp: int, cp: int = 1, tp: int = 1) -> list[tuple[int, int, bool]]:
    """Every (ep, etp, folded) the rule allows a (dp, cp, tp) stage, ep = 1 unfolded first."""
    n = dp * cp * tp
    out = [(ep, 1, False) for ep in range(1, dp * cp + 1) if (dp * cp) % ep == 0]
    return out + [(ep, etp, True) for etp in range(1, n + 1) for ep in range(1, n + 1)
                  if n % (ep * etp) == 0]


def expert_compute_copies(tp: int, sequence_parallel: bool, fold: bool) -> int:
    """How many ranks compute each routed token's experts (MODEL). Unfolded without
    sequence parallelism the tp ranks hold the same tokens and each runs them through its
    own whole copy of the experts: tp copies. With sequence parallelism, or folded (each
    tp rank routes only its 1/tp of the sequence), once."""
    return tp if tp > 1 and not sequence_parallel and not fold else 1


def check_ep_divides_dp_cp(ep: int, dp: int, cp: int) -> None:
    """Expert parallelism is folded into the data-parallel ranks: dp·cp of them, cut into
    runs of ep (the mesh's "ep" groups)."""
    if (dp * cp) % ep:
        raise ValueError(f"ep={ep} does not divide dp*cp={dp * cp}: unfolded, expert "
                         "parallelism lives in the data-parallel ranks (fold=True, "
                         "Megatron's parallel folding, lets it span tp: ep*etp must then "
                         "divide dp*cp*tp)")
