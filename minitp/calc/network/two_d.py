"""1D (Megatron) vs 2D (SUMMA) tensor parallelism for one linear layer: a MODEL of
the bytes each rank sends, the collectives it joins, their latency terms, and what
it keeps for backward. Everything here is per linear layer, forward + backward.

The layer is Y = XW + b with X (tokens × d_in), one forward and one backward.

1D, N ranks (Shoeybi et al. 2019): the weight is split one way and the layer
pays one all-reduce of a whole activation, forward for a row-parallel layer (Y,
tokens × d_out), backward for a column-parallel one (dX, tokens × d_in):
2(N−1)/N·S per rank. With sequence parallelism (Korthikanti et al. 2022) the
all-reduce becomes an all-gather and a reduce-scatter of the same tensor: the
same 2(N−1)/N·S, in 2 collectives, and the activations outside the linear layers
are split by N.

2D, N = q² ranks (`minitp.tensor_parallel.two_d`): X and W in q × q blocks. Each
rank gathers its row's X blocks and its column's W blocks forward, and
reduce-scatters the same two shapes backward, plus the bias gradient's
all-reduce along the column: each gather/scatter sends (q−1)·block. Two variants:

* ``regather=False``, minitp's `Linear2D`: it saves the gathered blocks for
  backward. Two moves per tensor: 2(q−1)/q²·(T·d_in + d_in·d_out); every rank
  holds q× its X block and q× its weight shard from forward to backward.
* ``regather=True``, Optimus (Xu et al. 2021) and SUMMA as written: it keeps only
  its own blocks and gathers (broadcasts) them again in backward. Three moves
  per tensor: 3(q−1)/q²·(T·d_in + d_in·d_out); no gathered copy is held.

With d_in = d_out = d and no bias, 2D sends fewer bytes than 1D exactly when
  saved:     2(q−1)(Td + d²) < 2(q²−1)·Td  ⟺  d < q·T
  regather:  3(q−1)(Td + d²) < 2(q²−1)·Td  ⟺  d < (2q−1)·T/3.
Latency: a ring collective over n ranks is n−1 steps (2(n−1) for an all-reduce),
each paying α once; a broadcast is counted as a chain of n−1 hops.

A 2D transformer layer is not only its linear layers: its LayerNorms normalize each
token over d features that lie along the grid row, so their statistics need all-reduces
of their own (`layernorm2d_parts`, `layernorm2d_latency`), which 1D never pays.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .._util import number
from .comm import ring_wire_bytes

SCHEMES_1D = ("1d-row", "1d-column", "1d-sp-row", "1d-sp-column")
SCHEMES_2D = ("2d", "2d-broadcast", "2d-regather")


def _exact(op: str, nbytes, n: int) -> Fraction:
    return Fraction(ring_wire_bytes(op, nbytes, n))


def _grid(n: int) -> int:
    q = math.isqrt(n)
    if q * q != n:
        raise ValueError(f"2D tensor parallelism needs a square number of ranks, got {n}")
    return q


def tp1d_linear_bytes(tokens: int, d_in: int, d_out: int, n: int, kind: str = "row",
                      bytes_per_value: int = 2, sequence_parallel: bool = False,
                      gloo: bool = False) -> int | float:
    """Bytes one rank sends for one 1D tensor-parallel linear layer, forward + backward:
    one all-reduce of Y (``kind="row"``, forward) or of dX (``"column"``, backward).
    ``sequence_parallel``: an all-gather and a reduce-scatter of that tensor instead
    (the same bytes in the ring model). ``gloo``: gloo's reduce-scatter sends an
    all-reduce's 2(n−1)/n (`minitp.calc.network.comm`), what CPU ranks measure."""
    if kind not in ("row", "column"):
        raise ValueError(f"kind must be 'row' or 'column', got {kind!r}")
    activation = tokens * (d_out if kind == "row" else d_in) * bytes_per_value
    if not sequence_parallel:
        return number(_exact("all_reduce", activation, n))
    scatter = "all_reduce" if gloo else "reduce_scatter"
    return number(_exact("all_gather", activation, n) + _exact(scatter, activation, n))


def tp2d_linear_parts(tokens: int, d_in: int, d_out: int, q: int, bias: bool = True,
                      bytes_per_value: int = 2, gloo: bool = False,
                      regather: bool = False) -> dict[str, int | float]:
    """Bytes one rank sends for each collective of one 2D (q × q) linear layer, forward
    + backward, in the ring model. Each key names the collective and its axis.

    ``gloo=True``: gloo's reduce-scatter, which sends what an all-reduce sends,
    2(q−1)/q of the tensor, not the ring's (q−1)/q. ``regather=True``: the blocks
    are gathered again in backward (Optimus), two more all-gathers."""
    scatter = "all_reduce" if gloo else "reduce_scatter"
    x_row = Fraction(tokens, q) * d_in * bytes_per_value  # X_i·: the row's X blocks
    w_col = Fraction(d_out, q) * d_in * bytes_per_value  # W_·j: the column's W blocks
    parts = {
        "all_gather X (row)": _exact("all_gather", x_row, q),
        "all_gather W (col)": _exact("all_gather", w_col, q),
    }
    if regather:
        parts["all_gather X again (row, bwd)"] = _exact("all_gather", x_row, q)
        parts["all_gather W again (col, bwd)"] = _exact("all_gather", w_col, q)
    parts["reduce_scatter dX (row)"] = _exact(scatter, x_row, q)
    parts["reduce_scatter dW (col)"] = _exact(scatter, w_col, q)
    if bias:
        parts["all_reduce db (col)"] = _exact("all_reduce", Fraction(d_out, q) * bytes_per_value,
                                              q)
    return {name: number(value) for name, value in parts.items()}


def tp2d_linear_bytes(tokens: int, d_in: int, d_out: int, q: int, bias: bool = True,
                      bytes_per_value: int = 2, gloo: bool = False,
                      regather: bool = False) -> int | float:
    """Bytes one rank sends for one 2D (q × q) linear layer, forward + backward (the
    sum of `tp2d_linear_parts`)."""
    parts = tp2d_linear_parts(tokens, d_in, d_out, q, bias, bytes_per_value, gloo, regather)
    return number(sum(Fraction(v) for v in parts.values()))


def tp_linear_latency(scheme: str, n: int, bias: bool = True) -> dict[str, int]:
    """The collectives one rank joins for one linear layer, forward + backward, and
    the latency terms (α, one per sequential step of the ring or chain) they pay.

    scheme: "1d" (one all-reduce over n), "1d-sp" (an all-gather and a
    reduce-scatter over n), "2d" (gathers and reduce-scatters over q = √n, the
    gathered blocks saved), "2d-regather" (the two gathers again in backward) or
    "2d-broadcast" (SUMMA's q broadcasts per axis forward, saved)."""
    if scheme in ("1d", "1d-sp"):
        return {"collectives": 1 if scheme == "1d" else 2, "alpha": 2 * (n - 1)}
    if scheme not in ("2d", "2d-regather", "2d-broadcast"):
        raise ValueError(f"scheme must be '1d', '1d-sp', '2d', '2d-regather' or "
                         f"'2d-broadcast', got {scheme!r}")
    q = _grid(n)
    forward = 2 * q if scheme == "2d-broadcast" else 2  # q broadcasts per axis, q−1 hops each
    backward = 4 if scheme == "2d-regather" else 2  # (gathers again and) reduce-scatters
    collectives = forward + backward
    alpha = (forward * (q - 1) if scheme == "2d-broadcast" else 2 * (q - 1)) + backward * (q - 1)
    if bias:
        collectives, alpha = collectives + 1, alpha + 2 * (q - 1)
    return {"collectives": collectives, "alpha": alpha}


def layernorm2d_parts(tokens: int, d: int, q: int, bytes_per_value: int = 4,
                      params: bool = True) -> dict[str, int | float]:
    """Bytes one rank sends for each collective of one LayerNorm on a q × q grid, forward
    + backward, in the ring model: a MODEL. Rank (i, j) holds tokens block i and features
    block j, so each token's d features lie along its grid row and every per-token sum
    over them is an all-reduce of T/q values along the row: Σx and Σx² forward (mean and
    variance), Σg and Σg·x̂ backward (g the output's gradient times γ), each its own
    all-reduce, as Colossal-AI's LayerNorm2D runs them (hpcaitech/ColossalAI,
    colossalai/nn/layer/parallel_2d/layers.py and _operation.py). ``params``: γ's and
    β's gradients too, each an all-reduce of d/q values along the column (every rank of
    column j holds γ_j and β_j, as `Linear2D`'s bias). 1D tensor parallelism, with or
    without sequence parallelism, needs none of the row's: a rank holds whole tokens."""
    stats = Fraction(tokens, q) * bytes_per_value
    parts = {f"all_reduce {what} (row)": _exact("all_reduce", stats, q)
             for what in ("Σx", "Σx²", "Σg, bwd", "Σg·x̂, bwd")}
    if params:
        for what in ("dγ, bwd", "dβ, bwd"):
            parts[f"all_reduce {what} (col)"] = _exact("all_reduce",
                                                       Fraction(d, q) * bytes_per_value, q)
    return {name: number(value) for name, value in parts.items()}


def layernorm2d_latency(q: int, params: bool = True) -> dict[str, int]:
    """The collectives of `layernorm2d_parts` and their α terms: each all-reduce over q
    ranks is 2(q−1) steps of the ring."""
    collectives = 6 if params else 4
    return {"collectives": collectives, "alpha": collectives * 2 * (q - 1)}


def saved_values(scheme: str, tokens: int, d_in: int, d_out: int, n: int) -> dict[str, int]:
    """Values one rank keeps for one linear layer's backward, from its forward until
    that backward runs, beside the weight shard it holds anyway: {"activation": ...,
    "weight": ...} (the weight entry counts gathered copies only).

    1D: a column-parallel layer keeps its whole input X (with sequence parallelism,
    the all-gathered X: minitp keeps it; Megatron-LM gathers it again in backward,
    Korthikanti et al. 2022 §4.2.2, and keeps T·d_in/n); a row-parallel layer its
    slice X_i. 2D: `Linear2D` keeps X_i· and W_·j, q× its blocks; the re-gather
    variant keeps its own X block only."""
    if scheme in ("1d-row", "1d-sp-row"):
        return {"activation": tokens * d_in // n, "weight": 0}
    if scheme in ("1d-column", "1d-sp-column"):
        return {"activation": tokens * d_in, "weight": 0}
    q = _grid(n)
    if scheme in ("2d", "2d-broadcast"):
        return {"activation": tokens * d_in // q, "weight": d_in * d_out // q}
    if scheme == "2d-regather":
        return {"activation": tokens * d_in // n, "weight": 0}
    raise ValueError(f"scheme must be one of {SCHEMES_1D + SCHEMES_2D}, got {scheme!r}")


def crossover_q(tokens: int, d: int, regather: bool = False) -> Fraction:
    """The grid side q above which 2D sends fewer bytes per rank than 1D (d_in = d_out
    = d, no bias; the formulas of the module docstring): d/T saved, (3d/T + 1)/2
    re-gathered. 2D wins for q strictly above it."""
    ratio = Fraction(d, tokens)
    return (3 * ratio + 1) / 2 if regather else ratio


def first_winning_grid(tokens: int, d: int, regather: bool = False, divides=(),
                       q_max: int = 1024) -> int | None:
    """The smallest q ≥ 2 where 2D's bytes (no bias) fall below 1D's at N = q², found by
    evaluating both formulas (not from `crossover_q`), and where q divides every
    number in ``divides`` (d, the heads, the tokens: whole blocks on every rank)."""
    for q in range(2, q_max + 1):
        if any(m % q for m in divides):
            continue
        two = tp2d_linear_bytes(tokens, d, d, q, bias=False, regather=regather)
        if two < tp1d_linear_bytes(tokens, d, d, q * q):
            return q
    return None
