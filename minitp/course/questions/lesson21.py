"""Lesson 21's questions: the step between e4m3 values near a number, the bytes of a
rowwise FP8 all-gather of an MLP weight under ZeRO-3, and which axes an activation's or a
gradient's amax is reduced over on a (dp, tp) mesh."""

from __future__ import annotations

import math

from ...calc.fp8 import fp8_all_gather_bytes
from ...rules.fp8_groups import amax_axes
from .form import Question, Wrong

MiB = 2**20
# x for 21.e4m3-step: none of them an e4m3 value, so "the two e4m3 values around x" are one
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
        key="21.e4m3-step", seed=seed, draw=lambda rng: {"v": rng.choice(VALUES)},
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
                          "1/16 at its end (lesson 21's picture)."),
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
        key="21.gather-bytes", seed=seed, draw=draw,
        text=lambda p: (f"ZeRO-3 shards the MLP's first weight W (4h × h, h = {p['h']}) by rows "
                        f"over N = {p['n']} GPUs and all-gathers it before each use in FP8 with "
                        "rowwise scaling: one byte a value, and one float32 scale per row, "
                        "sent with the shard. How many MiB does one GPU send for one gather "
                        "(a ring)? (MiB; within 1%.)"),
        right=sent,
        wrong=[
            Wrong(lambda p: sent(p, "bf16"), "that is bf16's gather, two bytes a value"),
            Wrong(lambda p: sent(p, share=1), "a GPU does not send the whole tensor: it "
                                              "forwards N-1 of its N shards, (N-1)/N of it"),
            Wrong(lambda p: sent(p, share=1 / p["n"]), "that is the GPU's own shard once: on "
                                                       "a ring each GPU forwards N-1 shards"),
        ],
        worked=lambda p: (f"(N-1)/N × (4h·h values × 1 byte + 4h scales × 4 bytes) = "
                          f"{p['n'] - 1}/{p['n']} × ({4 * p['h'] ** 2:,} + {16 * p['h']:,}) "
                          f"bytes = {sent(p):.2f} MiB (`calc.fp8_all_gather_bytes`, a MODEL), "
                          f"against bf16's {sent(p, 'bf16'):.2f} MiB: the scales add "
                          f"4/h = {4 / p['h']:.2%}, so FP8 sends about half."),
    )


LETTERS = {(): "a", ("dp",): "b", ("tp",): "c", ("dp", "tp"): "d"}
CASES = [(layer, role, sp) for layer in ("column", "row") for role in ("input", "grad")
         for sp in (False, True)]


def which_group(seed=None) -> Question:
    def right_axes(p):
        return tuple(a for a in amax_axes(p["layer"], p["role"], "tensorwise", p["sp"])
                     if a != "cp")

    def right(p):
        return LETTERS[right_axes(p)]

    def toggled(p):
        axes = right_axes(p)
        return LETTERS[("dp",) if "tp" in axes else ("dp", "tp")]

    what = {("column", "input"): "input", ("column", "grad"): "output gradient",
            ("row", "input"): "input", ("row", "grad"): "output gradient"}
    when_sp = {("column", "input"): " (cast on this rank's sequence shard, before SP's "
                                    "all-gather)",
               ("row", "grad"): " (cast after SP's all-gather has made it whole)"}

    def tensor(p):  # SP's all-gather is named only where there is one
        return what[p["layer"], p["role"]] + (when_sp.get((p["layer"], p["role"]), "")
                                              if p["sp"] else "")

    def worked(p):
        axes = right_axes(p)
        said = (f"the {p['layer']} layer's {what[p['layer'], p['role']]} is split over "
                f"{' and '.join(axes)} as its cast sees it (`minitp.rules.fp8_groups`): "
                f"answer {right(p)}. ")
        if "tp" not in axes:
            return said + ("It is whole on every tp rank, so tp holds copies: reducing over "
                           "tp too would give the same scale (Megatron-LM's one group over "
                           "tp × dp does), a larger all-reduce for nothing, and none at all "
                           "would leave each dp rank the amax of its own rows.")
        if p["sp"] and (p["layer"], p["role"]) == ("column", "input"):
            return said + ("Under SP each tp rank casts its own positions before the "
                           "gather, so tp joins dp (TransformerEngine PR #74); without it "
                           "each tp rank would scale its positions apart.")
        return said + ("Each tp rank holds other features of it: without tp each would "
                       "scale its piece apart, the drift lesson 21's local-scale run shows.")
    return Question(
        key="21.which-group", seed=seed, kind="choice",
        draw=lambda rng: dict(zip(("layer", "role", "sp"), rng.choice(CASES), strict=True)),
        text=lambda p: (f"A tensor-parallel MLP trains in FP8 with tensorwise scaling on a "
                        f"dp × tp mesh, {'with' if p['sp'] else 'without'} sequence "
                        f"parallelism. Over which axes must the amax of the {p['layer']}-"
                        f"parallel layer's {tensor(p)} be MAX-reduced, so "
                        "that every rank casts with the scale one device would use? Answer "
                        "'a', 'b', 'c' or 'd': (a) none; (b) dp; (c) tp; (d) dp and tp."),
        right=right,
        wrong=[
            Wrong(lambda p: "a", "no reduction leaves every rank its own amax: a local scale, "
                                 "the trap lesson 21 runs on purpose"),
            Wrong(lambda p: "c", "the data-parallel ranks hold other rows of the batch: their "
                                 "pieces of an activation or a gradient differ too"),
            Wrong(toggled, "tp decides: a tensor split over tp (the row layer's input, the "
                           "column layer's output gradient, the column layer's input cast on "
                           "its sequence shard under SP) needs it; one whole on every tp rank "
                           "(the column layer's input without SP, the row layer's gradient) "
                           "does not"),
        ],
        worked=worked,
    )


QUESTIONS = {"21.e4m3-step": e4m3_step, "21.gather-bytes": gather_bytes,
             "21.which-group": which_group}
