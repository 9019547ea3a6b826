"""Lesson 06's questions: a 2D layer's bytes per rank, its latency terms, and whether 2D or
1D+SP sends fewer bytes inside a node."""

from __future__ import annotations

from ...calc.two_d import tp1d_linear_bytes, tp2d_linear_bytes, tp_linear_latency
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
            f"{saved(p):,.0f} bytes, a MODEL (`minitp.calc.two_d.tp2d_linear_bytes`, bias=False). "
            f"1D over {p['q'] ** 2} ranks would send "
            f"{tp1d_linear_bytes(p['T'], p['d'], p['d'], p['q'] ** 2):,.0f}: 2D sends fewer "
            f"bytes exactly when d < qT, and here d/T = {p['d'] / p['T']:.3g}, q = {p['q']}."),
    )


def alpha_terms(seed=None) -> Question:
    def draw(rng):  # q = 2 and q = 3 would make two answers equal (the lesson's table)
        return {"q": rng.choice((4, 8, 16, 32))}

    def n(p):
        return p["q"] ** 2

    return Question(
        key="06.alpha-terms", seed=seed, draw=draw,
        text=lambda p: (f"A linear layer with a bias runs 2D tensor parallel on a {p['q']} × "
                        f"{p['q']} grid (N = {n(p)} ranks), saving the gathered blocks (minitp's "
                        "`Linear2D`). In the lesson's latency model each sequential step of a "
                        "ring collective over n ranks pays α once: n - 1 steps for an all-gather "
                        "or a reduce-scatter, 2(n - 1) for an all-reduce. How many α terms does "
                        "one rank pay for the layer, forward and backward? (A whole number.)"),
        right=lambda p: tp_linear_latency("2d", n(p))["alpha"],
        wrong=[
            Wrong(lambda p: tp_linear_latency("1d", n(p))["alpha"],
                  "that is 1D's all-reduce over all N ranks, 2(N-1): 2D's collectives span only "
                  "a row or a column, q = √N ranks"),
            Wrong(lambda p: tp_linear_latency("2d", n(p), bias=False)["alpha"],
                  "that leaves out the bias: its gradient is summed along the column, one more "
                  "all-reduce of 2(q-1) steps"),
            Wrong(lambda p: tp_linear_latency("2d-regather", n(p))["alpha"],
                  "that gathers X and W again in backward (Optimus): `Linear2D` saves them, so "
                  "backward runs only the two reduce-scatters and the bias's all-reduce"),
            Wrong(lambda p: tp_linear_latency("2d", n(p))["collectives"],
                  "that counts the collectives, 5; each pays one α per step of its ring"),
        ],
        worked=lambda p: (
            f"forward: an all-gather along the row and one along the column, q - 1 = "
            f"{p['q'] - 1} steps each; backward: two reduce-scatters, {p['q'] - 1} steps each, "
            f"and the bias's all-reduce along the column, 2(q - 1) = {2 * (p['q'] - 1)}. "
            f"In all 6(q - 1) = {tp_linear_latency('2d', n(p))['alpha']} α terms (a MODEL: "
            "`minitp.calc.two_d.tp_linear_latency`), against 2(N - 1) = "
            f"{tp_linear_latency('1d', n(p))['alpha']} for 1D's ring all-reduce over N ranks."),
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
            f"MODEL, `minitp.calc.two_d`, no bias). With d/T = {p['d'] // p['T']}, above both "
            "crossovers (2 saved, 1 re-gathered), 1D+SP is the better deal inside a node."),
    )


QUESTIONS = {"06.2d-bytes": two_d_bytes, "06.alpha-terms": alpha_terms,
             "06.which-split": which_split}
