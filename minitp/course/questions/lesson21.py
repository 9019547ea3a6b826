"""Lesson 21's questions: the ZeRO stage to choose under a memory budget, and the microbatch at
which ZeRO-3 sends fewer bytes than tensor parallelism per token of work."""

from __future__ import annotations

import itertools

from ...calc.footprint.memory import model_state_bytes
from ...calc.network.cluster import GiB
from ...calc.network.comm import dp_comm_bytes, tp_comm_bytes
from .form import Question, Wrong
from .models import gpt

LETTERS = "abcd"  # ZeRO stages 0, 1, 2, 3
MICROBATCHES = 8


def _states_gib(billions, n, stage):
    return model_state_bytes(billions * 10**9, n, stage, "adam-mixed")["total"] / GiB


def _lowest_fitting(billions, n, budget):
    return next(s for s in range(4) if _states_gib(billions, n, s) <= budget)


def _clear(billions, n, budget):  # no stage within 3% of the budget: no near-ties
    return all(abs(_states_gib(billions, n, s) / budget - 1) > 0.03 for s in range(4))


# Only draws whose answer is stage 1 or 2, so that a stage below and a stage above exist.
ZERO_DRAWS = tuple(
    (b, n, budget) for b, n, budget in itertools.product((7, 13, 20, 30), (8, 16, 64),
                                                         (20, 30, 40, 60))
    if _states_gib(b, n, 3) <= budget and _lowest_fitting(b, n, budget) in (1, 2)
    and _clear(b, n, budget))


def which_stage(seed=None) -> Question:
    def draw(rng):
        billions, n, budget = rng.choice(ZERO_DRAWS)
        return {"billions": billions, "n": n, "budget": budget}

    def stage(p):
        return _lowest_fitting(p["billions"], p["n"], p["budget"])

    def far(p):  # two stages from the answer: stage 0 when it is 2, stage 3 when it is 1
        return "a" if stage(p) == 2 else "d"

    def table(p):
        return ", ".join(f"stage {s} {_states_gib(p['billions'], p['n'], s):.1f} GiB"
                         for s in range(4))

    return Question(
        key="21.which-stage", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A {p['billions']}B-parameter model trains by data parallelism alone "
                        f"over N = {p['n']} GPUs with mixed-precision Adam, 16 bytes a parameter "
                        "(2 + 2 + 12: Rajbhandari et al. 2020, §3.1), and "
                        f"{MICROBATCHES} microbatches a step. Each GPU has {p['budget']} GiB "
                        "left for model states. Which ZeRO stage do you choose, the one that "
                        "fits with the least communication (as minitp and `calc.step_time` "
                        "run them: stages 0 and 1 send 2Ψ a step, stage 2 reduce-scatters "
                        "every microbatch's gradient, stage 3 also gathers the parameters twice "
                        "a microbatch)? Answer 'a', 'b', 'c' or 'd': (a) stage 0; (b) stage 1; "
                        "(c) stage 2; (d) stage 3."),
        right=lambda p: LETTERS[stage(p)],
        wrong=[
            Wrong(lambda p: LETTERS[stage(p) - 1],
                  "that stage keeps more model states than the budget: it does not fit"),
            Wrong(lambda p: LETTERS[stage(p) + 1],
                  "that stage fits, but shards more than it must and sends more: stage 2 "
                  "reduce-scatters every microbatch's gradient, stage 3 also gathers the "
                  "parameters twice per microbatch"),
            Wrong(lambda p: far(p),
                  "that is two stages from the answer: stage 0 keeps 16 bytes a parameter on "
                  "every GPU, far over the budget; stage 3 fits, but gathers the parameters "
                  "twice a microbatch, the most bytes of all"),
        ],
        worked=lambda p: (
            f"per GPU (`calc.model_state_bytes`, Ψ = {p['billions']}B): 16Ψ at stage 0, "
            "4Ψ + 12Ψ/N at stage 1, 2Ψ + 14Ψ/N at stage 2, 16Ψ/N at stage 3: "
            f"{table(p)}. The lowest stage under {p['budget']} GiB is stage {stage(p)}. With "
            f"m = {MICROBATCHES} microbatches `calc.step_time` gives stage 2 (m + 1)/2 = "
            f"{(MICROBATCHES + 1) / 2} times stage 1's data-parallel time and stage 3 3m/2 = "
            f"{3 * MICROBATCHES // 2} times (lesson 21, a MODEL)."),
    )


MODELS = {"1.3B": gpt(2048, 16, 24), "13B": gpt(5120, 40, 40),
          "GPT-3 175B": gpt(12288, 96, 96)}


def break_even(seed=None) -> Question:
    # t = 2 is left out: there the per-microbatch mistake (factor t) would equal the one that
    # counts 2 all-reduces a layer (factor 2). N stays at most 64, so that (N-1)/N is > 1% from 1.
    def draw(rng):
        return {"model": rng.choice(tuple(MODELS)), "t": rng.choice((4, 8)),
                "n": rng.choice((16, 32, 64))}

    def tokens(p, halves=3, all_reduces=4, per_work=True, ring=True):
        cfg = MODELS[p["model"]]
        h, layers, t, n = cfg.d_model, cfg.n_layer, p["t"], p["n"]
        psi = 12 * layers * h * h  # the layers' weights only, as the question says
        zero = dp_comm_bytes(psi, n, 2, zero_stage=3) * halves / 3
        if not ring:
            zero = zero * n / (n - 1)
        tp_per_token = tp_comm_bytes(cfg, 1, t) * layers / cfg.seq_len * all_reduces / 4
        if per_work:
            tp_per_token *= t  # a TP GPU does 1/t of its tokens' work
        return zero / tp_per_token

    def text(p):
        cfg = MODELS[p["model"]]
        return (f"Compare, per token of work, the bytes one GPU sends for the {p['model']} GPT "
                f"(l = {cfg.n_layer}, h = {cfg.d_model}): Megatron tensor parallelism at "
                f"t = {p['t']} (4 ring all-reduces of bsh values a layer) against ZeRO-3 over "
                f"N = {p['n']} GPUs (gather, gather again, reduce-scatter: 3(N-1)/N·Ψ a "
                "microbatch, with Ψ = 12lh², the layers' weights only), both in 16-bit values. "
                "ZeRO-3's bytes are fixed per microbatch. From how many tokens per ZeRO-3 "
                "microbatch does it send fewer bytes per token of work? (Tokens; within 1%.)")

    return Question(
        key="21.break-even", seed=seed, draw=draw, text=text, right=tokens,
        wrong=[
            Wrong(lambda p: tokens(p, per_work=False),
                  "that compares bytes per microbatch token: a TP GPU does only 1/t of each "
                  "token's work, so per token of work it sends t times as much"),
            Wrong(lambda p: tokens(p, halves=2),
                  "that uses 2Ψ, plain data parallelism's (or ZeRO-1's) bytes; ZeRO-3 gathers "
                  "the parameters a second time for backward: 3Ψ"),
            Wrong(lambda p: tokens(p, all_reduces=2),
                  "that counts 2 all-reduces a layer, the forward's only; backward runs 2 more"),
            Wrong(lambda p: tokens(p, ring=False),
                  "that leaves out the ring's (N-1)/N: each rank sends N-1 of the N chunks"),
        ],
        worked=lambda p: (
            f"per token of work, TP sends 8bsh(t-1)/t per layer for bs/t tokens: 8h(t-1) "
            "values a layer; ZeRO-3 sends 3·12h²·(N-1)/N values a layer per microbatch of T "
            "tokens. Equal at T = 4.5h/(t-1)·(N-1)/N = "
            f"4.5·{MODELS[p['model']].d_model}/{p['t'] - 1}·{p['n'] - 1}/{p['n']} = "
            f"{tokens(p):,.0f} tokens (`calc.tp_comm_bytes`, `calc.dp_comm_bytes`: ring MODELS), "
            f"{tokens(p) / MODELS[p['model']].seq_len:.2f} sequences of 2048. Above it ZeRO-3 "
            "sends less. The lesson's table counts the embeddings in Ψ too, so its break-even is "
            "a little higher (0.64h to 0.69h at t = 8, N = 64)."),
    )


QUESTIONS = {"21.which-stage": which_stage, "21.break-even": break_even}
