"""Lesson 04's questions: Megatron-LM's padded vocabulary, the vocab-parallel loss's bytes,
and why the loss needs three all-reduces and not one local cross-entropy."""

from __future__ import annotations

from ...calc.network.comm import ring_wire_bytes
from ...rules import round_up
from .form import Question, Wrong

FP32 = 4  # bytes a value: Megatron-LM computes the loss in float32 (lesson 04)
# Vocabulary sizes to pad: the first is GPT-2's (Radford et al. 2019), the others are made up.
VOCABS = (50_257, 32_003, 40_478, 30_522, 64_007)


def padded_vocab(seed=None) -> Question:
    def draw(rng):
        return {"v": rng.choice(VOCABS), "t": rng.choice((2, 4, 8))}

    def right(p):
        return round_up(p["v"], 128 * p["t"])

    return Question(
        key="04.padded-vocab", seed=seed, draw=draw, rel_tol=1e-9,
        text=lambda p: (f"A tokenizer has V = {p['v']:,} tokens, and Megatron-LM trains with "
                        f"t = {p['t']} tensor-parallel ranks and its default "
                        "`--make-vocab-size-divisible-by 128` (NVIDIA/Megatron-LM, "
                        "`megatron/training/arguments.py`, as lesson 04 read it). To how many "
                        "rows does it pad the embedding table? (A whole number, exactly.)"),
        right=right,
        wrong=[
            Wrong(lambda p: round_up(p["v"], p["t"]),
                  "that pads to a multiple of t only, the least that equal slices need (and "
                  "minitp's rule): Megatron-LM pads to a multiple of 128·t"),
            Wrong(lambda p: round_up(p["v"], 128),
                  "that pads to a multiple of 128: Megatron-LM multiplies 128 by t, so that "
                  "each rank's slice, V'/t rows, is itself a multiple of 128"),
            Wrong(lambda p: right(p) // p["t"],
                  "that is one rank's rows, V'/t: the question asks for the whole padded table"),
        ],
        worked=lambda p: (
            f"round V up to a multiple of 128·t = {128 * p['t']:,}: "
            f"⌈{p['v']:,}/{128 * p['t']:,}⌉·{128 * p['t']:,} = {right(p):,} rows, "
            f"{right(p) - p['v']:,} of them padding, {right(p) // p['t']:,} on each rank "
            "(a multiple of 128). The padded rows are never looked up and their logits are -inf "
            "in the loss: they cost memory, never the result."),
    )


def loss_bytes(seed=None) -> Question:
    def draw(rng):
        return {"b": rng.choice((1, 2, 4)), "s": rng.choice((2048, 4096)), "t": rng.choice((4, 8))}

    def tokens(p):
        return p["b"] * p["s"]

    def right(p):
        return 3 * ring_wire_bytes("all_reduce", tokens(p) * FP32, p["t"])

    return Question(
        key="04.loss-bytes", seed=seed, draw=draw,
        text=lambda p: (f"The vocab-parallel cross-entropy of this lesson runs over t = "
                        f"{p['t']} ranks, for a micro-batch of b = {p['b']} sequences of "
                        f"s = {p['s']:,} tokens, in float32 (4 bytes a value). In the ring "
                        "model, how many bytes does each rank send for the loss, forward and "
                        "backward together? (A number of bytes; within 1%.)"),
        right=right,
        wrong=[
            Wrong(lambda p: right(p) / 3,
                  "that is one all-reduce: the loss needs three (the max, the target logit and "
                  "the sum of exponentials)"),
            Wrong(lambda p: 2 * right(p),
                  "that counts the backward pass too: its softmax minus one-hot needs nothing "
                  "another rank holds, so it sends nothing"),
            Wrong(lambda p: 3 * tokens(p) * FP32,
                  "that counts each all-reduce as sending its tensor once: a ring all-reduce "
                  "sends 2(t-1)/t of it per rank"),
        ],
        worked=lambda p: (
            f"N = b·s = {tokens(p):,} tokens; each all-reduce carries one float32 per token, "
            f"{tokens(p) * FP32:,} bytes, and a ring sends 2(t-1)/t of that per rank: "
            f"{ring_wire_bytes('all_reduce', tokens(p) * FP32, p['t']):,.0f} bytes. Three "
            f"forward, none backward: {right(p):,.0f} bytes, a MODEL. Gathering the logits "
            "instead would send (t-1)/t·N·V' values: V'/6 times as many."),
    )


def no_gather(seed=None) -> Question:
    def draw(rng):
        return {"t": rng.choice((2, 4, 8))}

    return Question(
        key="04.no-gather", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"Each of t = {p['t']} ranks holds the logits of its own range of the "
                        "vocabulary, N × V'/t. You need the mean cross-entropy over the whole "
                        "vocabulary, exactly, and want to send as few bytes as possible. What "
                        "do you do? Answer 'a', 'b', 'c' or 'd': (a) each rank runs "
                        "F.cross_entropy on its own columns, and an all-reduce averages the t "
                        "losses; (b) all-gather the logits, then F.cross_entropy on every rank; "
                        "(c) all-reduce the per-token max, the target logit and the per-token "
                        "sum of exponentials, one number per token each; (d) each rank "
                        "subtracts its own per-token max, then all-reduces the target logit and "
                        "the sum of exponentials."),
        right=lambda p: "c",
        wrong=[
            Wrong(lambda p: "a", "each rank's softmax would normalise over its own columns "
                                 "only, and a rank that does not hold a token's target has no "
                                 "loss for it: the average is not the cross-entropy"),
            Wrong(lambda p: "b", "exact, but each rank sends (t-1)/t·N·V' values and holds "
                                 "all N × V' logits: V'/6 times the bytes of (c)"),
            Wrong(lambda p: "d", "each rank's e^(z-m) would be scaled by its own m, so the "
                                 "ranks' sums cannot be added: the max must be the same on "
                                 "every rank, the global one"),
        ],
        worked=lambda p: (
            "ℓ_n = log Σ_v e^(z_nv - m_n) - (z_ny - m_n) needs, per token, only three numbers "
            "that span the ranks: the global max m_n (all-reduce, op max), the shifted target "
            "logit (one rank holds it, a sum all-reduce hands it to all) and the sum of "
            "exponentials (sum all-reduce). Three all-reduces of N numbers; the backward, "
            "softmax minus one-hot on each rank's own columns, sends nothing."),
    )


QUESTIONS = {"04.padded-vocab": padded_vocab, "04.loss-bytes": loss_bytes,
             "04.no-gather": no_gather}
