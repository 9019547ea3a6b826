"""Every group of a mesh's dimensions, computed without any processes: the rank
arithmetic `Mesh` builds its process groups from (`minitp.runtime.mesh` describes the
order, Megatron-LM's: tp fastest, then cp, dp, pp)."""

from __future__ import annotations

import torch

from ..rules import check_expert_mesh, check_positive_int, folded


def layout(dp: int = 1, pp: int = 1, tp: int = 1, *, cp: int = 1, ep: int = 1, etp: int = 1,
           fold: bool = False) -> dict[str, list[list[int]]]:
    """Every group of every dimension for a (dp, pp, cp, tp) mesh, without any processes.
    The "cp" and "dp_cp" groups are listed only when cp > 1; "ep" and "expert_dp" only
    when ep > 1 or folded, "etp" only when etp > 1. Which (ep, etp) a mesh allows:
    `minitp.rules.check_expert_mesh` (all of them: `minitp.rules.expert_meshes`).

    Unfolded (the default): expert parallelism lives in dp×cp, each dp_cp group cut into
    runs of ep consecutive ranks (an "ep" group shares out the experts), "expert_dp" the
    ranks at the same place of every run (they hold the same experts).

    Folded (``fold=True``, implied by etp > 1; Megatron-Core's "parallel folding"): the
    experts factor each pipeline stage's dp·cp·tp ranks afresh, in rank order, as
    (edp, ep, etp) with etp fastest (Megatron-Core's expert order "tp-ep-dp"), so an
    "ep" group may span tp and cp.

    >>> layout(dp=2, pp=2, tp=2)["tp"]
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> layout(dp=2, cp=2)["cp"], layout(dp=2, cp=2)["dp_cp"]
    ([[0, 1], [2, 3]], [[0, 1, 2, 3]])
    >>> layout(dp=4, tp=2, ep=2)["ep"], layout(dp=4, tp=2, ep=2)["expert_dp"]
    ([[0, 2], [4, 6], [1, 3], [5, 7]], [[0, 4], [2, 6], [1, 5], [3, 7]])
    >>> layout(dp=2, tp=2, ep=4, fold=True)["ep"]
    [[0, 1, 2, 3]]
    >>> g = layout(dp=2, tp=2, ep=2, etp=2)
    >>> g["etp"], g["ep"], g["expert_dp"]
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1], [2], [3]])
    """
    check_sizes(dp, pp, tp, cp)
    check_positive_int("ep", ep)
    check_positive_int("etp", etp)
    check_expert_mesh(ep, dp, cp, tp, etp, fold)
    grid = torch.arange(dp * pp * cp * tp).reshape(pp, dp, cp, tp)  # tp fastest, then cp
    groups = {
        "tp": grid.reshape(-1, tp).tolist(),
        "dp": grid.permute(0, 2, 3, 1).reshape(-1, dp).tolist(),  # (pp, cp, tp, dp)
        "pp": grid.permute(1, 2, 3, 0).reshape(-1, pp).tolist(),  # (dp, cp, tp, pp)
    }
    if cp > 1:
        groups["cp"] = grid.permute(0, 1, 3, 2).reshape(-1, cp).tolist()  # (pp, dp, tp, cp)
        groups["dp_cp"] = grid.permute(0, 3, 1, 2).reshape(-1, dp * cp).tolist()  # (pp, tp, dp·cp)
    if folded(etp, fold):
        experts = grid.reshape(pp, -1, ep, etp)  # (pp, edp, ep, etp): the stage in rank order
        edp = experts.shape[1]
        if etp > 1:
            groups["etp"] = experts.reshape(-1, etp).tolist()
        groups["ep"] = experts.permute(0, 1, 3, 2).reshape(-1, ep).tolist()
        groups["expert_dp"] = experts.permute(0, 2, 3, 1).reshape(-1, edp).tolist()
    elif ep > 1:
        dp_cp = grid.permute(0, 3, 1, 2).reshape(-1, dp * cp // ep, ep)  # (pp·tp, runs, ep)
        groups["ep"] = dp_cp.reshape(-1, ep).tolist()
        groups["expert_dp"] = dp_cp.transpose(1, 2).reshape(-1, dp * cp // ep).tolist()
    return groups


def check_sizes(dp, pp, tp, cp=1) -> None:
    for name, value in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
        check_positive_int(name, value)
