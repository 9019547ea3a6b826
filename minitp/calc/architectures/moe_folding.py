"""MoE parallel folding in the calculator: the routed experts' work and communication of
the three layouts a pipeline stage's ranks can give them (`minitp.expert_parallel.plan`).
Every number here is a MODEL.

* unfolded, ep ⊂ dp·cp and experts whole over tp: without sequence parallelism every tp
  rank runs the same tokens through the same experts, tp copies of the work
  (`minitp.rules.expert_compute_copies`);
* folded, experts shared out over ep ranks that may span tp: each rank routes its own
  1/tp of the sequence, one all-to-all over ep (`minitp.calc.moe_all_to_all_bytes`);
* folded with expert tensor parallelism (etp): the same all-to-all over ep, then the
  rows gathered over etp and the partial outputs summed back (`etp_extra_bytes`).

Assumed: uniform routing (every rank receives as many rows as it sends), nothing dropped.
The measured counterparts are the trace's "moe dispatch"/"moe combine"/"moe etp gather"/
"moe etp scatter" all-to-alls (tests/expert_parallel/test_folding.py).
"""

from __future__ import annotations

from fractions import Fraction

from ...rules import check_positive_int, expert_compute_copies
from .._util import number
from ..network.comm import moe_all_to_all_bytes
from .moe import MoEShape


def routed_expert_flops(tokens: int, top_k: int, d_model: int, hidden: int, tp: int,
                        sequence_parallel: bool, fold: bool, matrices: int = 2) -> dict:
    """MODEL: the routed experts' training FLOPs (forward + backward: 6 per weight per
    row, Kaplan et al. 2020 §2.1) for the ``tokens`` tokens one tp group holds, summed
    over its tp ranks. ``matrices``: 2 for minitp's GELU MLP, 3 for a SwiGLU one.
    ``"copies"``: how many times each token's expert work is done; ``"needed"``: the work
    once; ``"flops"``: what the ranks do; ``"repeated"``: the difference."""
    copies = expert_compute_copies(tp, sequence_parallel, fold)
    needed = 6 * tokens * top_k * matrices * d_model * hidden
    return {"copies": copies, "needed": needed, "flops": copies * needed,
            "repeated": (copies - 1) * needed}


def etp_extra_bytes(tokens: int, top_k: int, d_model: int, etp: int, local_experts: int = 0,
                    bytes_per_element: int = 2, forwards: int = 1) -> dict:
    """MODEL: what expert tensor parallelism adds per rank and MoE layer, on top of the ep
    all-to-all: after it, uniform routing leaves ``tokens``·k rows on the rank.
    ``"gather"``: it sends them to the etp − 1 others ("moe etp gather");
    ``"scatter"``: it sends back the partial outputs of the others' rows, as many
    ("moe etp scatter"); backward sends both again (each the other's adjoint);
    ``"counts"``: the rows-per-local-expert table all-gathered before each forward
    (``local_experts`` int64, the ring's (etp − 1)/etp of etp tables).
    ``"per_layer_step"``: all of it for ``forwards`` forwards. Values exact."""
    check_positive_int("etp", etp)
    one = Fraction(tokens * top_k * (etp - 1) * d_model * bytes_per_element)
    counts = (etp - 1) * local_experts * 8
    return {"gather": number(one), "scatter": number(one), "counts": number(counts),
            "per_layer_step": number(forwards * (4 * one + counts))}


def folding_bytes(shape: MoEShape, tokens: int, ep: int, etp: int = 1,
                  bytes_per_element: int = 2) -> dict:
    """MODEL: one MoE layer of `shape` per training step per rank, ``tokens`` the tokens
    the rank routes (its own slice: b·s/(tp·cp) under folding), with the experts over
    ep × etp ranks. ``"ep"``: the dispatch/combine all-to-alls over ep with their counts
    (`moe_all_to_all_bytes`); ``"etp"``: `etp_extra_bytes`; ``"total"``; and
    ``"expert_weights"``: the routed experts' elements a rank holds (E/(ep·etp) experts'
    worth either way); ``"gemm_hidden"``: each expert GEMM's hidden width on a rank (what
    torchtitan PR #3167 found too thin once split by etp)."""
    d, k, E = shape.d_model, shape.top_k, shape.n_experts
    if E % ep or shape.expert_hidden % etp:
        raise ValueError(f"ep={ep} must divide n_experts={E} and etp={etp} the expert "
                         f"hidden width {shape.expert_hidden}")
    a2a = moe_all_to_all_bytes(tokens, k, d, ep, bytes_per_element, E)["per_layer_step"]
    extra = etp_extra_bytes(tokens, k, d, etp, E // ep, bytes_per_element)["per_layer_step"]
    weights = (3 if shape.glu else 2) * d * shape.expert_hidden * E // (ep * etp)
    return {"ep": a2a, "etp": extra, "total": a2a + extra, "expert_weights": weights,
            "gemm_hidden": shape.expert_hidden // etp}


def fold_vs_etp(shape: MoEShape, tokens: int, ranks: int, etp: int,
                bytes_per_element: int = 2) -> dict:
    """MODEL: ``ranks`` ranks share a layer's experts either all by expert parallelism
    (folded, ep = ranks: torchtitan's choice) or as ep = ranks/etp times etp. Both hold
    the same expert weights per rank and do the same expert FLOPs; the bytes differ:
    ``{"folded": folding_bytes(ep=ranks), "etp": folding_bytes(ep=ranks/etp, etp),
    "ratio": etp total / folded total}``."""
    if ranks % etp:
        raise ValueError(f"etp={etp} does not divide ranks={ranks}")
    folded = folding_bytes(shape, tokens, ranks, 1, bytes_per_element)
    split = folding_bytes(shape, tokens, ranks // etp, etp, bytes_per_element)
    return {"folded": folded, "etp": split, "ratio": split["total"] / folded["total"]}
