"""Lesson 06's questions: a 2D layer's bytes per rank, the latency terms of a 2D MLP block
(its LayerNorm included), and whether 2D or 1D+SP sends fewer bytes inside a node."""

from __future__ import annotations

from ...calc.network.two_d import (
    layernorm2d_latency,
    tp1d_linear_bytes,
    tp2d_linear_bytes,
    tp_linear_latency,
)
from .form import Question, Wrong

# (T, d, q) with whole blocks (q divides T and d) and d/T at least 1/8 and at least 10% away
# from both crossovers, d = qT (saved) and d = (2q-1)T/3 (re-gathered): no two answers below
# can coincide within the tolerance.
_GRIDS = tuple((t, d, q) for t in (1024, 2048, 4096) for d in (1024, 2048, 4096, 8192, 12288)
               for q in (2, 4, 8)
               if t % q == 0 and d % q == 0 and d * 8 >= t
               and abs(d - q * t) > 0.1 * q * t and abs(3 * d - (2 * q - 1) * t) > 0.1 * d)


def two_d_bytes(seed=None) -> Question:
    def draw(rng):
        t, d, q = rng.choice(_GRIDS)
        return {"T": t, "d": d, "q": q}

    def saved(p, regather=False):
        return tp2d_linear_bytes(p["T"], p["d"], p["d"], p["q"], bias=False, bytes_per_value=2,
                                 regather=regather)

    return Question(
        key="06.2d-bytes", seed=seed, draw=draw,
        text=lambda p: (f"A linear layer Y = XW, no bias, X of T = {p['T']} tokens × d = "
                        f"{p['d']}, W of d × d, in bf16 (2 bytes a value), runs 2D tensor "
                        f"parallel on a {p['q']} × {p['q']} grid (N = {p['q'] ** 2} ranks), "
                        "saving the gathered blocks for backward as minitp's `Linear2D` does. "
                        "How many bytes does one rank send for it, forward and backward, in the "
                        "ring model? (A number of bytes; within 1%.)"),
        right=saved,
        wrong=[
            Wrong(lambda p: saved(p, regather=True),
                  "that gathers the blocks again in backward (Optimus): three moves per tensor; "
                  "saving them, as `Linear2D` does, needs two"),
            Wrong(lambda p: 2 * (p["q"] - 1) / p["q"] ** 2 * p["T"] * p["d"] * 2,
                  "that moves only X's blocks: in 2D the weight's blocks move too, gathered "
                  "along the column forward and their gradients reduce-scattered backward"),
            Wrong(lambda p: tp1d_linear_bytes(p["T"], p["d"], p["d"], p["q"] ** 2),
                  "that is 1D tensor parallelism over N ranks, one all-reduce of the whole "
                  "activation, 2(N-1)/N·T·d·2 bytes"),
        ],
        worked=lambda p: (
            f"the row's X blocks are T/q × d/q = {p['T'] // p['q']} × {p['d'] // p['q']}, the "
            f"column's W blocks d/q × d/q; forward gathers q - 1 = {p['q'] - 1} of each, "
            "backward reduce-scatters the same shapes: 2(q-1)/q²·(Td + d²)·2 bytes = "
            f"{saved(p):,.0f} bytes, a MODEL (`minitp.calc.network.two_d.tp2d_linear_bytes`, "
            "bias=False). "
            f"1D over {p['q'] ** 2} ranks would send "
            f"{tp1d_linear_bytes(p['T'], p['d'], p['d'], p['q'] ** 2):,.0f}: 2D sends fewer "
            f"bytes exactly when d < qT, and here d/T = {p['d'] / p['T']:.3g}, q = {p['q']}."),
    )


def alpha_terms(seed=None) -> Question:
    def draw(rng):  # q = 4 and q = 6 would make two answers below equal
        return {"q": rng.choice((7, 8, 12, 16))}

    def linears(p, scheme="2d"):  # the block's two linear layers, with biases
        return 2 * tp_linear_latency(scheme, p["q"] ** 2)["alpha"]

    def norm(p):
        return layernorm2d_latency(p["q"])["alpha"]

    def ring(p):  # one all-reduce along a row or a column
        return 2 * (p["q"] - 1)

    return Question(
        key="06.alpha-terms", seed=seed, draw=draw,
        text=lambda p: (f"A transformer's MLP block runs 2D tensor parallel on a {p['q']} × "
                        f"{p['q']} grid (N = {p['q'] ** 2} ranks): a LayerNorm (the lesson's "
                        "`LayerNorm2D`, each sum it needs its own collective), then two "
                        "`Linear2D` layers with biases, gathered blocks saved, a GELU between "
                        "them. In the lesson's latency model (one α per sequential step of a "
                        "ring collective), how many α terms does one rank pay for the block, "
                        "forward and backward? (A whole number.)"),
        right=lambda p: linears(p) + norm(p),
        wrong=[
            Wrong(lambda p: linears(p),
                  "that is the two linear layers alone: the LayerNorm normalizes each token "
                  "over d features that lie along the grid row, and every sum it needs is an "
                  "all-reduce"),
            Wrong(lambda p: linears(p) + 2 * ring(p),
                  "that counts the LayerNorm's forward statistics only (Σx and Σx²); its "
                  "backward needs two more sums along the row, and γ and β their gradients "
                  "summed along the column"),
            Wrong(lambda p: linears(p) + 4 * ring(p),
                  "that is four of the LayerNorm's six all-reduces: its statistics take two "
                  "forward and two backward along the row, and γ's and β's gradients one each "
                  "along the column, as the bias's"),
            Wrong(lambda p: linears(p, "2d-regather") + norm(p),
                  "that gathers X and W again in backward (Optimus): `Linear2D` saves them"),
            Wrong(lambda p: 2 * tp_linear_latency("1d", p["q"] ** 2)["alpha"],
                  "that is 1D's MLP over all N ranks, an all-reduce of 2(N-1) steps forward and "
                  "one backward: 2D's collectives span a row or a column, q ranks"),
            Wrong(lambda p: 2 * tp_linear_latency("2d", p["q"] ** 2)["collectives"]
                  + layernorm2d_latency(p["q"])["collectives"],
                  "that counts the collectives; each pays one α per step of its ring"),
        ],
        worked=lambda p: (
            f"each Linear2D: two all-gathers forward and two reduce-scatters backward, q - 1 = "
            f"{p['q'] - 1} steps each, and the bias's all-reduce along the column, 2(q - 1) = "
            f"{ring(p)}: 6(q - 1) = {linears(p) // 2}. The LayerNorm: Σx and Σx² forward, Σg "
            f"and Σg·x̂ backward, all-reduced along the row, and dγ, dβ along the column: six "
            f"all-reduces, 12(q - 1) = {norm(p)}. In all 2·6(q - 1) + 12(q - 1) = 24(q - 1) = "
            f"{linears(p) + norm(p)} α terms (a MODEL: "
            "`minitp.calc.network.two_d.tp_linear_latency` and "
            "`layernorm2d_latency`): the LayerNorm pays as many as the two linear layers. "
            f"1D's MLP over N ranks pays 4(N - 1) = "
            f"{2 * tp_linear_latency('1d', p['q'] ** 2)['alpha']}, and no LayerNorm collective."),
    )


def which_split(seed=None) -> Question:
    def draw(rng):  # d ≥ 4T: above both crossovers on a 2 × 2 grid (d < 2T, d < T)
        t, d = rng.choice(((1024, 4096), (1024, 8192), (1024, 12288), (2048, 8192),
                           (2048, 12288)))
        return {"T": t, "d": d}

    return Question(
        key="06.which-split", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A linear layer d × d with d = {p['d']}, T = {p['T']} tokens a "
                        "microbatch, is to be split over 4 GPUs of one node. Which split sends "
                        "the fewest bytes per rank, forward and backward, in the ring model? "
                        "Answer 'a', 'b', 'c' or 'd': (a) 1D with sequence parallelism over 4; "
                        "(b) 2D on a 2 × 2 grid, gathered blocks saved (`Linear2D`); (c) 2D on "
                        "a 2 × 2 grid, blocks gathered again in backward (Optimus); (d) all send "
                        "the same, since each splits the layer 4 ways."),
        right=lambda p: "a",
        wrong=[
            Wrong(lambda p: "b", "2D saved sends fewer bytes only when d < √N·T = 2T; here d "
                                 "is larger, and the weight blocks 2D moves cost more than the "
                                 "activation bytes it saves"),
            Wrong(lambda p: "c", "2D re-gathered moves each tensor three times, 1.5 times what "
                                 "2D saved sends: it never beats it in bytes, and wins against "
                                 "1D only when d < (2√N - 1)·T/3 = T"),
            Wrong(lambda p: "d", "splitting 4 ways does not fix the bytes: 1D sends about 2Td "
                                 "values whatever N is, 2D sends 2(q-1)/q²·(Td + d²), and they "
                                 "are equal only at d = √N·T"),
        ],
        worked=lambda p: (
            f"per rank, in bf16: 1D+SP sends 2·(3/4)·T·d·2 = "
            f"{tp1d_linear_bytes(p['T'], p['d'], p['d'], 4, sequence_parallel=True):,} bytes "
            "(an all-gather and a reduce-scatter, the same bytes as 1D's all-reduce); 2D saved "
            f"2·(1/4)·(Td + d²)·2 = {tp2d_linear_bytes(p['T'], p['d'], p['d'], 2, bias=False):,}; "
            "2D re-gathered "
            f"{tp2d_linear_bytes(p['T'], p['d'], p['d'], 2, bias=False, regather=True):,} (a "
            f"MODEL, `minitp.calc.network.two_d`, no bias). With d/T = {p['d'] // p['T']}, "
            "above both "
            "crossovers (2 saved, 1 re-gathered), 1D+SP is the better deal inside a node."),
    )


QUESTIONS = {"06.2d-bytes": two_d_bytes, "06.alpha-terms": alpha_terms,
             "06.which-split": which_split}
