"""Lesson 12's questions: a rank's weight in the gradient sum, ZeRO-1's model states, and
when to send the gradients."""

from __future__ import annotations

from ...calc.cluster import GB
from ...calc.memory import model_state_bytes
from .form import Question, Wrong


def token_weight(seed=None) -> Question:
    def draw(rng):
        # k ignored targets on rank 0, at least a quarter of its slice: 1/D stays far off
        return {"d": rng.choice((2, 4, 8)), "rows": rng.choice((4, 8)),
                "ignored": rng.choice((1024, 1536, 2048))}

    def counts(p):
        per_rank = p["rows"] * 1024
        return per_rank - p["ignored"], p["d"] * per_rank - p["ignored"]

    return Question(
        key="12.token-weight", seed=seed, draw=draw,
        text=lambda p: (f"A global batch is split over D = {p['d']} data-parallel ranks, "
                        f"{p['rows']} rows of 1,024 tokens each. Rank 0's slice has "
                        f"{p['ignored']:,} ignored targets (-100); no other rank has any. Each "
                        "rank computes the mean loss over its own counted tokens. By what "
                        "factor must rank 0 scale that mean loss before backward, so that an "
                        "all-reduce with SUM leaves every rank the gradient of the global "
                        "batch's mean loss? (A number; within 1%.)"),
        right=lambda p: counts(p)[0] / counts(p)[1],
        wrong=[
            Wrong(lambda p: 1 / p["d"],
                  "that is averaging the ranks: right only when every slice counts the same "
                  "tokens, and rank 0's counts fewer"),
            Wrong(lambda p: 1.0, "a plain sum of the ranks' mean-loss gradients is about D times "
                                 "too large, and still weights rank 0's tokens wrongly"),
            Wrong(lambda p: 1 / counts(p)[1],
                  "the mean loss has already divided by rank 0's own count: multiply by "
                  "n_0/N, not divide by N once more"),
        ],
        worked=lambda p: (
            f"the global mean is Σ_d (n_d/N)·L_d. Rank 0 counts n_0 = "
            f"{p['rows']}·1024 - {p['ignored']} = {counts(p)[0]:,} tokens, the batch N = "
            f"{p['d']}·{p['rows']}·1024 - {p['ignored']} = {counts(p)[1]:,}: n_0/N = "
            f"{counts(p)[0] / counts(p)[1]:.4f} (1/D would be {1 / p['d']:.4f}). That is what "
            "`mt.train_step` multiplies rank 0's mean loss by (with one microbatch per step)."),
    )


def zero1_bytes(seed=None) -> Question:
    def draw(rng):
        return {"billions": rng.choice((7, 13, 30, 70)), "d": rng.choice((8, 16, 64))}

    def gb(p, stage):
        return model_state_bytes(p["billions"] * 10**9, dp=p["d"], zero_stage=stage,
                                 optimizer="adam-mixed")["total"] / GB

    return Question(
        key="12.zero1-bytes", seed=seed, draw=draw,
        text=lambda p: (f"A model of Ψ = {p['billions']}B parameters trains with Adam in mixed "
                        "precision: 16-bit parameters and gradients (2 + 2 bytes each), and an "
                        "fp32 copy of the parameters, momentum and variance (12 bytes), as "
                        "ZeRO counts them (Rajbhandari et al. 2020, §3.1). With ZeRO stage 1 "
                        f"over d = {p['d']} data-parallel ranks, how many GB (10^9 bytes) of "
                        "model states (parameters, gradients, optimizer state) does each rank "
                        "hold? (In GB; within 1%.)"),
        right=lambda p: gb(p, 1),
        wrong=[
            Wrong(lambda p: gb(p, 0), "that is every rank holding all 16 bytes a parameter: "
                                      "no ZeRO"),
            Wrong(lambda p: gb(p, 2), "that shards the gradients too: ZeRO stage 2"),
            Wrong(lambda p: gb(p, 3), "that shards everything, 16Ψ/d: ZeRO stage 3; stage 1 "
                                      "shards only the optimizer state"),
            Wrong(lambda p: 12 * p["billions"] / p["d"],
                  "that is the optimizer state alone; the parameters and gradients, 4 bytes "
                  "each in all, stay whole on every rank"),
        ],
        worked=lambda p: (
            f"stage 1 shards the 12 bytes of optimizer state over d and keeps the 2 + 2 "
            f"whole: (4 + 12/d)·Ψ = (4 + 12/{p['d']})·{p['billions']}·10^9 bytes = "
            f"{gb(p, 1):.2f} GB (`minitp.calc.model_state_bytes`, a MODEL; this lesson measured "
            f"1/d of the optimizer state at d = 4, in fp32), against {gb(p, 0):.0f} GB "
            "without ZeRO."),
    )


def when_to_send(seed=None) -> Question:
    def draw(rng):
        return {"m": rng.choice((4, 8, 16)), "tensors": rng.choice((148, 292, 580))}

    return Question(
        key="12.when-to-send", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A data-parallel step runs m = {p['m']} microbatches, gradients "
                        f"accumulating, on a model of {p['tensors']} parameter tensors. How "
                        "should the gradients be summed over the ranks, to move the fewest "
                        "bytes and hide the sum behind computation? Answer 'a', 'b', 'c' or "
                        "'d': (a) one all-reduce of all the gradients after the last backward; "
                        "(b) one all-reduce per parameter tensor, each as soon as its gradient "
                        "is ready; (c) buckets of several tensors in reverse order, each "
                        "all-reduced as soon as its last gradient of the last microbatch is "
                        "in, waited for before the optimizer step; (d) buckets all-reduced "
                        "during every microbatch's backward."),
        right=lambda p: "c",
        wrong=[
            Wrong(lambda p: "a", "the right bytes, but nothing overlaps: the network idles "
                                 "during backward and the processors during the all-reduce"),
            Wrong(lambda p: "b", "it overlaps, but pays one message's latency per tensor, "
                                 "many small all-reduces instead of a few large ones"),
            Wrong(lambda p: "d", "while microbatches accumulate the gradients are partial: "
                                 "sending them every microbatch moves m times the bytes"),
        ],
        worked=lambda p: (
            "buckets, in reverse parameter order because backward reaches the last layers "
            "first, each all-reduce started by a post-accumulate-grad hook as soon as the "
            "bucket is complete, armed only for the last microbatch: each gradient is sent "
            f"once, in a few messages instead of {p['tensors']}, and not {p['m']} times; the "
            "sums of the last layers are in flight while earlier layers' gradients are still "
            "being computed (the lesson's trace: every bucket started inside the last "
            "backward). PyTorch DDP and Megatron-LM do the same."),
    )


QUESTIONS = {"12.token-weight": token_weight, "12.zero1-bytes": zero1_bytes,
             "12.when-to-send": when_to_send}
