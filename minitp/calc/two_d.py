"""1D (Megatron) vs 2D (SUMMA) tensor parallelism for one linear layer: a MODEL of
the bytes each rank sends, the collectives it joins and their latency terms.

The layer is Y = XW + b with X (tokens × d_in), one forward and one backward.

1D, N ranks (Shoeybi et al. 2019): the weight is split one way and the layer
pays one all-reduce of a whole activation, forward for a row-parallel layer (Y,
tokens × d_out), backward for a column-parallel one (dX, tokens × d_in):
2(N−1)/N·S per rank — about 2S whatever N.

2D, N = q² ranks (`minitp.tensor_parallel.two_d`): X and W in q × q blocks. Each
rank gathers its row's X blocks and its column's W blocks forward, and
reduce-scatters the same two shapes backward, plus the bias gradient's
all-reduce along the column: each gather/scatter sends (q−1)/q of a tensor of q
blocks, i.e. (q−1)·block. In all, 2(q−1)/q²·(tokens·d_in + d_in·d_out) + the bias:
it falls like 1/√N, but it moves the weights, which 1D never does.

With d_in = d_out = d and no bias, 2D sends fewer bytes exactly when
(q−1)(T·d + d²) < (q²−1)·T·d, i.e. d < q·T = √N·T: the weight must be small
beside the activation. Latency: a ring collective over n ranks is n−1 steps
(2(n−1) for an all-reduce), each paying α once; a broadcast is counted as a
chain of n−1 hops.
"""

from __future__ import annotations

from fractions import Fraction

from ._util import number
from .comm import ring_wire_bytes


def _exact(op: str, nbytes, n: int) -> Fraction:
    return Fraction(ring_wire_bytes(op, nbytes, n))


def tp1d_linear_bytes(tokens: int, d_in: int, d_out: int, n: int, kind: str = "row",
                      bytes_per_value: int = 2) -> int | float:
    """Bytes one rank sends for a 1D tensor-parallel linear layer, forward + backward:
    one all-reduce of Y (``kind="row"``, forward) or of dX (``"column"``, backward)."""
    if kind not in ("row", "column"):
        raise ValueError(f"kind must be 'row' or 'column', got {kind!r}")
    activation = tokens * (d_out if kind == "row" else d_in) * bytes_per_value
    return number(_exact("all_reduce", activation, n))


def tp2d_linear_parts(tokens: int, d_in: int, d_out: int, q: int, bias: bool = True,
                      bytes_per_value: int = 2, gloo: bool = False) -> dict[str, int | float]:
    """Bytes one rank sends for each collective of a 2D (q × q) linear layer, forward
    + backward, in the ring model. Each key names the collective and its axis.

    ``gloo=True``: the same model with gloo's reduce-scatter, which sends what an
    all-reduce sends, 2(q−1)/q of the tensor (`minitp.calc.comm`), not the ring's
    (q−1)/q: what to expect measured on CPU ranks."""
    scatter = "all_reduce" if gloo else "reduce_scatter"
    x_row = Fraction(tokens, q) * d_in * bytes_per_value  # X_i·: the row's X blocks
    w_col = Fraction(d_out, q) * d_in * bytes_per_value  # W_·j: the column's W blocks
    parts = {
        "all_gather X (row)": _exact("all_gather", x_row, q),
        "all_gather W (col)": _exact("all_gather", w_col, q),
        "reduce_scatter dX (row)": _exact(scatter, x_row, q),
        "reduce_scatter dW (col)": _exact(scatter, w_col, q),
    }
    if bias:
        parts["all_reduce db (col)"] = _exact("all_reduce", Fraction(d_out, q) * bytes_per_value,
                                              q)
    return {name: number(value) for name, value in parts.items()}


def tp2d_linear_bytes(tokens: int, d_in: int, d_out: int, q: int, bias: bool = True,
                      bytes_per_value: int = 2, gloo: bool = False) -> int | float:
    """Bytes one rank sends for a 2D (q × q) linear layer, forward + backward (the sum
    of `tp2d_linear_parts`)."""
    parts = tp2d_linear_parts(tokens, d_in, d_out, q, bias, bytes_per_value, gloo)
    return number(sum(Fraction(v) for v in parts.values()))


def tp_linear_latency(scheme: str, n: int, bias: bool = True) -> dict[str, int]:
    """The collectives one rank joins for one linear layer, forward + backward, and
    the latency terms (α, one per sequential step of the ring or chain) they pay.

    scheme: "1d" (one all-reduce over n), "2d" (gathers and reduce-scatters over
    q = √n, `collective="all_gather"`) or "2d-broadcast" (SUMMA's q broadcasts per
    axis forward)."""
    if scheme == "1d":
        return {"collectives": 1, "alpha": 2 * (n - 1)}
    q = round(n ** 0.5)
    if q * q != n:
        raise ValueError(f"2D tensor parallelism needs a square number of ranks, got {n}")
    if scheme not in ("2d", "2d-broadcast"):
        raise ValueError(f"scheme must be '1d', '2d' or '2d-broadcast', got {scheme!r}")
    forward = 2 if scheme == "2d" else 2 * q  # q broadcasts per axis, each q−1 hops
    collectives, alpha = forward + 2, forward * (q - 1) + 2 * (q - 1)
    if bias:
        collectives, alpha = collectives + 1, alpha + 2 * (q - 1)
    return {"collectives": collectives, "alpha": alpha}
