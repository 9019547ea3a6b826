"""Lesson 23's questions: the step between e4m3 values near a number, the bytes of a
rowwise FP8 all-gather of an MLP weight under ZeRO-3, and which axes one of rowwise's six
casts reduces its amax over on a (dp, tp) mesh (a setting lesson 23's table, tensorwise,
does not print: the learner works out what one scale covers and who cuts it)."""

from __future__ import annotations

import math

from ...calc.footprint.fp8 import fp8_all_gather_bytes
from ...rules.fp8_groups import amax_axes
from .form import Question, Wrong

MiB = 2**20
# x for 23.e4m3-step: none of them an e4m3 value, so "the two e4m3 values around x" are one
# step apart (issue 48: 5.0, 12.0 and 40.0 were drawn, each on the grid, and 4.5 and 5.5
# around 5.0 are two steps apart); nor an e5m2 or a bfloat16 value, so the steps the usual
# mistakes name are those formats' gaps around x too; none a tie between two e4m3 values,
# none near a power of two (where 0.125·x, a usual mistake, would meet a step).
VALUES = (0.3, 1.7, 5.2, 11.3, 37.1, 90.3, 301.3)


def _binade(v):
    return math.floor(math.log2(v))


def e4m3_step(seed=None) -> Question:
    def step(p, mantissa_bits=3):
        return 2.0 ** (_binade(p["v"]) - mantissa_bits)

    def around(p):
        below = math.floor(p["v"] / step(p)) * step(p)
        return below, below + step(p)

    return Question(
        key="23.e4m3-step", seed=seed, draw=lambda rng: {"v": rng.choice(VALUES)},
        text=lambda p: (f"x = {p['v']} is not an e4m3 value (`torch.float8_e4m3fn`: 4 "
                        "exponent bits, 3 mantissa bits): a cast to e4m3 rounds it to one of "
                        "the two e4m3 values around it, the largest below x or the smallest "
                        "above x. How far apart are those two values: the step of e4m3's grid "
                        "at x? (Within 0.1%.)"),
        right=step,
        wrong=[
            Wrong(lambda p: step(p, 2), "that is e5m2's step there: 2 mantissa bits, twice as "
                                        "coarse"),
            Wrong(lambda p: step(p, 7), "that is bfloat16's step there: 7 mantissa bits"),
            Wrong(lambda p: step(p) / 2, "that is half the step: the largest rounding error, "
                                         "x's distance to the nearer value at worst"),
            Wrong(lambda p: 0.125 * p["v"], "that is the value times e4m3's epsilon (2⁻³): the "
                                            "step is fixed across a binade, 2^(e-3) for values "
                                            "in [2^e, 2^(e+1))"),
        ],
        worked=lambda p: (f"{p['v']} lies in [2^{_binade(p['v'])}, 2^{_binade(p['v']) + 1}); "
                          "3 mantissa bits cut that binade into 8 steps of 2^(e-3) = "
                          f"{step(p):g}, so the e4m3 values around x are {around(p)[0]:g} and "
                          f"{around(p)[1]:g}. The relative step is 1/8 at the binade's start, "
                          "1/16 at its end (lesson 23's picture)."),
        rel_tol=0.001,
    )


def gather_bytes(seed=None) -> Question:
    def draw(rng):
        return {"h": rng.choice((2048, 4096, 8192)), "n": rng.choice((8, 16, 64))}

    def sent(p, kind="fp8", share=None):
        got = fp8_all_gather_bytes(4 * p["h"], p["h"], p["n"], "rowwise")
        full = got[kind] / ((p["n"] - 1) / p["n"])
        return (got[kind] if share is None else full * share) / MiB

    return Question(
        key="23.gather-bytes", seed=seed, draw=draw,
        text=lambda p: (f"ZeRO-3 shards the MLP's first weight W (4h × h, h = {p['h']}) by rows "
                        f"over N = {p['n']} GPUs and all-gathers it before each use in FP8 with "
                        "rowwise scaling: one byte a value, and one float32 scale per row, "
                        "sent with the shard. How many MiB does one GPU send for one gather "
                        "(a ring)? (MiB; within 1%.)"),
        right=sent,
        wrong=ring_gather_wrongs(sent),
        worked=lambda p: (f"(N-1)/N × (4h·h values × 1 byte + 4h scales × 4 bytes) = "
                          f"{p['n'] - 1}/{p['n']} × ({4 * p['h'] ** 2:,} + {16 * p['h']:,}) "
                          f"bytes = {sent(p):.2f} MiB (`calc.fp8_all_gather_bytes`, a MODEL), "
                          f"against bf16's {sent(p, 'bf16'):.2f} MiB: the scales add "
                          f"4/h = {4 / p['h']:.2%}, so FP8 sends about half."),
    )


def ring_gather_wrongs(sent) -> list[Wrong]:
    """The usual mistakes of a ring all-gather's bytes, `sent(p, key="fp8", share=None)` the
    right answer's function ("bf16": the same gather in bf16; `share`: of the whole tensor)."""
    return [Wrong(lambda p: sent(p, "bf16"), "that is bf16's gather, two bytes a value"),
            Wrong(lambda p: sent(p, share=1), "a GPU does not send the whole tensor: it "
                                              "forwards N-1 of its N shards, (N-1)/N of it"),
            Wrong(lambda p: sent(p, share=1 / p["n"]), "that is the GPU's own shard once: on "
                                                       "a ring each GPU forwards N-1 shards")]


LETTERS = {(): "a", ("dp",): "b", ("tp",): "c", ("dp", "tp"): "d"}
# rowwise's six casts: (the GEMM that reads it, the slice one of its scales covers)
SLICES = {"input": ("forward, y = x Wᵀ", "one token of x, over its input features"),
          "weight": ("forward", "one row of W (an output feature), over its inputs"),
          "grad": ("dgrad, ∂x = g W", "one token of the output gradient g, over its output "
                                      "features"),
          "weight_dgrad": ("dgrad", "one column of W (an input feature), over its outputs"),
          "input_wgrad": ("wgrad, ∂W = gᵀ x", "one input feature of x, over the batch's "
                                              "tokens"),
          "grad_wgrad": ("wgrad", "one output feature of g, over the batch's tokens")}
CASES = [(layer, role, sp) for layer in ("column", "row") for role in SLICES
         for sp in (False, True)]
# who holds what of the slice a scale covers, as the cast sees it (the worked answer's words)
HELD = {("column", "input"): "every tp rank holds x whole{gathered}",
        ("row", "input"): "each tp rank holds 1/tp of every token's features",
        ("column", "weight"): "each tp rank holds whole rows of W (its output features)",
        ("row", "weight"): "each tp rank holds 1/tp of every row (its input columns)",
        ("column", "grad"): "each tp rank holds 1/tp of every token's output features",
        ("row", "grad"): "every tp rank holds g whole{gathered_g}",
        ("column", "weight_dgrad"): "each tp rank holds 1/tp of every column (its rows)",
        ("row", "weight_dgrad"): "each tp rank holds whole columns of W",
        ("column", "input_wgrad"): "every tp rank holds x whole{gathered}",
        ("row", "input_wgrad"): "each tp rank holds its own features, each over every token",
        ("column", "grad_wgrad"): "each tp rank holds its own output features, each over "
                                  "every token",
        ("row", "grad_wgrad"): "every tp rank holds g whole{gathered_g}"}


def which_group(seed=None) -> Question:
    def right_axes(p):
        return tuple(a for a in amax_axes(p["layer"], p["role"], "rowwise", p["sp"])
                     if a != "cp")

    def right(p):
        return LETTERS[right_axes(p)]

    def toggled(p, axis):
        axes = set(right_axes(p)) ^ {axis}
        return LETTERS[tuple(a for a in ("dp", "tp") if a in axes)]

    def note(p):  # SP's all-gather is named only where there is one, and the cast sees it
        if not p["sp"]:
            return ""
        if p["layer"] == "column" and p["role"].startswith("input"):
            return " (after SP's all-gather: rowwise gathers x in high precision)"
        if p["layer"] == "row" and p["role"].startswith("grad"):
            return " (SP's all-gather made it whole before the cast)"
        return ""

    def worked(p):
        axes = right_axes(p)
        held = HELD[p["layer"], p["role"]].format(gathered=note(p), gathered_g=note(p))
        dp = ("the dp ranks hold other tokens, so dp cuts each slice"
              if p["role"].endswith("wgrad") else "no slice spans tokens of two dp ranks "
              "(a token, or W, is whole on one), so dp cuts none")
        tp = "tp cuts each slice" if "tp" in axes else "tp cuts none"
        return (f"One scale covers {SLICES[p['role']][1]}: {dp}; {held}, so {tp}: answer "
                f"{right(p)}. A rowwise amax is reduced only over the axes that cut the slice "
                "its scale covers (along the dimension the GEMM sums over); an axis that holds "
                "copies, or only decides which slices a rank has, changes nothing.")

    return Question(
        key="23.which-group", seed=seed, kind="choice",
        draw=lambda rng: dict(zip(("layer", "role", "sp"), rng.choice(CASES), strict=True)),
        text=lambda p: (f"A tensor-parallel MLP trains in FP8 with torchao's rowwise recipe on "
                        f"a dp × tp mesh (each dp rank its own rows of the batch), "
                        f"{'with' if p['sp'] else 'without'} sequence parallelism. Each GEMM "
                        "reads its operands scaled along the dimension it sums over, so the "
                        f"backward casts again. Take the {p['layer']}-parallel layer's cast "
                        f"for {SLICES[p['role']][0]}: one scale for each "
                        f"{SLICES[p['role']][1].removeprefix('one ')}{note(p)}. Over which "
                        "axes must its amax be MAX-reduced, so that every rank casts with the "
                        "scales one device would use, and over no axis that changes nothing? "
                        "Answer 'a', 'b', 'c' or 'd': (a) none; (b) dp; (c) tp; (d) dp and tp."),
        right=right,
        wrong=[
            Wrong(lambda p: toggled(p, "tp"), "tp: it counts only where it cuts the slice "
                                              "one scale covers (a token's features in the "
                                              "row layer's input and the column layer's "
                                              "output gradient; a row of the row layer's W; "
                                              "a column of the column layer's W); where it "
                                              "holds copies, or only decides which slices a "
                                              "rank has, it changes nothing"),
            Wrong(lambda p: toggled(p, "dp"), "dp: its ranks hold other tokens of the batch, "
                                              "so it counts for a scale taken over the tokens "
                                              "(wgrad's re-casts of x and g) and for none "
                                              "taken within one token or within W"),
        ],
        worked=worked,
    )


QUESTIONS = {"23.e4m3-step": e4m3_step, "23.gather-bytes": gather_bytes,
             "23.which-group": which_group}
