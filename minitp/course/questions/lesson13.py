"""Lesson 13's questions: a rank's weight in the gradient sum, ZeRO-1's model states, and
how many buckets hide the gradient sum best."""

from __future__ import annotations

from ...calc.footprint.memory import model_state_bytes
from ...calc.network.cluster import GB
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
        key="13.token-weight", seed=seed, draw=draw,
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
        key="13.zero1-bytes", seed=seed, draw=draw,
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


BUCKETS = (1, 8, 64, 512)  # the four choices: how many equal buckets the gradients go in


def exposed_ms(k: int, p: dict) -> float:
    """Milliseconds the step waits after its last backward, with the gradients in k equal
    buckets: bucket i is complete at i·T/k (backward produces them evenly, last layers
    first), each all-reduce takes c = α + (G/k)/B, one at a time. The last finishes at
    max_i (i·T/k + (k − i + 1)·c): i = k when c ≤ T/k (only the last bucket's c shows),
    else i = 1 (the all-reduces queue)."""
    c = p["alpha_us"] / 1e3 + p["mib"] * 2**20 / k / (p["gbs"] * 1e9) * 1e3
    return max(c, p["T"] / k + k * c - p["T"])


def when_to_send(seed=None) -> Question:
    def draw(rng):
        while True:  # a draw whose best bucket count is clearly best (5% or more)
            p = {"T": rng.choice((20, 40, 80)), "mib": rng.choice((100, 400, 1600)),
                 "gbs": rng.choice((25, 100)), "alpha_us": rng.choice((20, 100, 500))}
            times = sorted(exposed_ms(k, p) for k in BUCKETS)
            if times[1] > 1.05 * times[0]:
                return p

    def best(p):
        return "abcd"[min(range(4), key=lambda i: exposed_ms(BUCKETS[i], p))]

    q = Question(
        key="13.when-to-send", seed=seed, draw=draw, kind="choice",
        text=lambda p: (
            f"The last microbatch's backward takes T = {p['T']} ms and produces the "
            f"{p['mib']:,} MiB of gradients evenly, last layers first. They are summed over "
            "the data-parallel ranks in k equal buckets, each all-reduced as soon as it is "
            "complete, one all-reduce at a time; an all-reduce of X bytes takes "
            f"α + X/B with α = {p['alpha_us']} µs and B = {p['gbs']} GB/s (lesson 01's fit). "
            "Which k makes the optimizer step wait least after backward ends? Answer 'a', "
            "'b', 'c' or 'd': (a) k = 1; (b) k = 8; (c) k = 64; (d) k = 512."),
        right=best,
        wrong=[
            Wrong(lambda p: "a", "one bucket: the whole all-reduce, α + G/B, starts only when "
                  "backward ends; nothing overlaps"),
            Wrong(lambda p: "b", "8 buckets keep up with backward here only if c ≤ T/8; even "
                  "then the last one, an eighth of the bytes, is a long tail after backward"),
            Wrong(lambda p: "c", "64 buckets: compare their tail with the others', and check "
                  "that each all-reduce (α + G/64B) still fits in its 1/64 of backward"),
            Wrong(lambda p: "d", "512 buckets pay α 512 times: each all-reduce is mostly "
                  "latency, and once it takes longer than T/512 they queue past backward's end"),
        ],
        worked=lambda p: (
            "with k buckets each all-reduce takes c = α + (G/k)/B and bucket i is ready at "
            "i·T/k; if c ≤ T/k every all-reduce ends before the next bucket is ready, so only "
            "the last one's c is left after backward; otherwise they queue and the last ends "
            "T/k + k·c after backward began. Waits after backward: "
            + "; ".join(f"k = {k}: {exposed_ms(k, p):.2f} ms" for k in BUCKETS)
            + ". Few buckets: a big tail; many: α paid k times. This is why PyTorch's DDP "
            "(`bucket_cap_mb`, 25 MB by default) and Megatron-LM bucket by size, not per "
            "tensor or all at once."),
    )
    q.wrong = [w for w in q.wrong if w.value(q.params) != q.right(q.params)]  # 3 of the 4
    return q


QUESTIONS = {"13.token-weight": token_weight, "13.zero1-bytes": zero1_bytes,
             "13.when-to-send": when_to_send}
