"""Muon's costs, modelled (MODEL): its model-state bytes per rank under ZeRO, and the bytes
per step each distributed strategy sends (`minitp.optim.strategies`).

Muon keeps one state tensor per matrix element, its momentum, where Adam keeps two. So the
bytes per parameter of lesson 21 come out smaller for the matrices Muon steps: with every
tensor in float32, 4 (parameter) + 4 (gradient) + 4 (momentum) = 12 instead of Adam's 16;
in ZeRO's mixed precision (Rajbhandari et al. 2020, §3.1: fp16 parameter and gradient,
fp32 master copy), 2 + 2 + (4 + 4) = 12 instead of 16 ("K" 8 instead of 12). The other
parameters (embeddings, norms, biases) stay AdamW's.
"""

from __future__ import annotations

from fractions import Fraction

from ...rules import check_zero_stage
from .._util import number

# bytes per parameter (parameter, gradient, optimizer state), for a matrix Muon steps and
# for the rest (AdamW)
MUON_OPTIMIZERS = {
    "muon-fp32": {"matrix": (4, 4, 4), "rest": (4, 4, 8)},
    "muon-mixed": {"matrix": (2, 2, 8), "rest": (2, 2, 12)},
}
NS_STEPS = 5  # torch.optim.Muon's default


def ns_flops(rows: int, cols: int, steps: int = NS_STEPS, split: int = 1,
             split_dim: int | None = None) -> int:
    """FLOPs (2 per multiply-add) of Newton–Schulz on a rows×cols matrix, on one rank. Per
    iteration, with u the side the Gram matrix is of and s the other: the Gram matrix
    (2u²s), its square (2u³) and the product with X (2u²s). One device: u the short side
    (`minitp.optim.newton_schulz`). Split along `split_dim` over `split` ranks
    (`newton_schulz_tp`): u the unsplit side, and each rank's s is 1/split of the split one."""
    if split == 1 or split_dim is None:
        u, s = sorted((rows, cols))
    else:
        u, s = (cols, rows // split) if split_dim == 0 else (rows, cols // split)
    return steps * (4 * u * u * s + 2 * u ** 3)


def lpt_owners(costs: list[int], ranks: int) -> list[int]:
    """Longest processing time first (Graham 1969): the matrices by cost, largest first,
    each to the rank with the least work so far (ties: the lower index, then rank), so
    every rank computes the same map. Its makespan is at most 4/3 of the best."""
    load, owner = [0] * ranks, [0] * len(costs)
    for j in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        owner[j] = min(range(ranks), key=lambda r: (load[r], r))
        load[owner[j]] += costs[j]
    return owner


def muon_state_bytes(n_matrix: int, n_rest: int, dp: int = 1, zero_stage: int = 0,
                     optimizer: str = "muon-fp32") -> dict:
    """Parameters, gradients and optimizer state on one dp rank, in bytes: ``n_matrix``
    parameters in Muon's matrices, ``n_rest`` under AdamW; ZeRO shards the optimizer state
    (stage 1), the gradients (2), the parameters (3) over the dp ranks, as
    `minitp.calc.model_state_bytes` does for Adam."""
    if optimizer not in MUON_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(MUON_OPTIMIZERS)}, "
                         f"got {optimizer!r}")
    check_zero_stage(zero_stage)
    if n_matrix < 0 or n_rest < 0 or dp < 1:
        raise ValueError(f"need n_matrix, n_rest >= 0 and dp >= 1, got {n_matrix}, "
                         f"{n_rest}, {dp}")
    table = MUON_OPTIMIZERS[optimizer]
    result = {}
    for i, kind in enumerate(("parameters", "gradients", "optimizer")):
        whole = Fraction(n_matrix * table["matrix"][i] + n_rest * table["rest"][i])
        result[kind] = number(whole / dp if zero_stage >= 3 - i else whole)  # 3, 2, 1
    result["total"] = number(sum(Fraction(v) for v in result.values()))
    return result


def muon_comm_bytes(matrices, strategy: str, dp: int = 1, tp: int = 1, zero_stage: int = 0,
                    bytes_per: int = 4, ns_steps: int = NS_STEPS) -> dict:
    """Bytes one rank sends per step (ring MODEL, as `mt.trace` counts them), on average
    over the ranks, to give Newton–Schulz the whole matrix: ``{"dp", "tp", "total"}``.

    matrices: (rows, cols, split_dim[, held]) for each whole matrix of one pipeline stage;
    split_dim 0 or 1 where tp splits it, None where every tp rank holds it whole; held (ZeRO
    stages 1-3): the elements of the tp block each dp rank holds, default an even 1/dp
    (minitp's flat shards cut the blocks where they fall: `Piece.ranges` says where).

    * gather: one all-gather over dp of each rank's run of pieces, padded to the longest
      run; over tp, (tp−1)/tp of the split matrices.
    * owner: each matrix's pieces that are not at its home (`lpt_owners`) go there and
      come back (stage 0: the home holds it all; only the result goes out, to dp−1
      ranks); over tp, only the owned matrices: 1/dp of gather's.
    * tp: gather's dp part; over tp, per split matrix an all-reduce of the Gram matrix of
      its unsplit side per iteration and one of the squared norm, 2(tp−1)/tp each."""
    if strategy not in ("gather", "owner", "tp"):
        raise ValueError(f"strategy must be 'gather', 'owner' or 'tp', got {strategy!r}")
    check_zero_stage(zero_stage)
    split = [s is not None and tp > 1 for _, _, s, *_ in matrices]
    blocks = [Fraction(r * c, tp if cut else 1)
              for (r, c, *_), cut in zip(matrices, split, strict=True)]
    held = [m[3] if len(m) > 3 else [b / dp] * dp for m, b in zip(matrices, blocks, strict=True)]
    dense_split = sum(r * c for (r, c, *_), cut in zip(matrices, split, strict=True) if cut)
    tp_part = Fraction(tp - 1, tp) * dense_split
    if strategy == "owner":
        owners = lpt_owners([ns_flops(r, c, ns_steps) for r, c, *_ in matrices], dp)
        away = [b - h[o] if zero_stage else 0 for b, h, o in zip(blocks, held, owners, strict=True)]
        out = sum(away) if zero_stage else sum(blocks) * (dp - 1)
        dp_part, tp_part = Fraction(sum(away) + out, dp), tp_part / dp
    else:
        width = max(sum(Fraction(h[r]) for h in held) for r in range(dp)) if held else 0
        dp_part = (dp - 1) * width if zero_stage else Fraction(0)
    if strategy == "tp":
        unsplit = [m[1] if m[2] == 0 else m[0]
                   for m, cut in zip(matrices, split, strict=True) if cut]
        tp_part = 2 * Fraction(tp - 1, tp) * sum(ns_steps * u * u + 1 for u in unsplit)
    out = {"dp": number(dp_part * bytes_per), "tp": number(tp_part * bytes_per)}
    out["total"] = number(Fraction(out["dp"]) + Fraction(out["tp"]))
    return out
