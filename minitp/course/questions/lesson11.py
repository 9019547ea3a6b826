"""Lesson 11's questions: ZB-H1's idle time, the activations a ZB-H1 stage holds, and how
to keep a global gradient-norm clip without the step's synchronization."""

from __future__ import annotations

from ...calc.flops import pipeline_idle
from ...pipeline.on_paper import simulate
from .form import Question, Wrong

UNIT = dict(F=1, B=1, W=1)


def zb_h1_idle(seed=None) -> Question:
    def draw(rng):
        p = rng.choice((4, 8))
        f = rng.choice((4, 5, 6))
        # W lighter than F and B: the condition under which (p-1)(F+B-W) is exact
        return {"p": p, "m": 2 * p, "F": f, "B": f + rng.choice((0, 1, 2)),
                "W": f - rng.choice((1, 2, 3))}

    def idle(p):
        return pipeline_idle("zb-h1", p["p"], p["m"], t_f=p["F"], t_b=p["B"], t_w=p["W"])["idle"]

    return Question(
        key="11.zb-h1-idle", seed=seed, draw=draw,
        text=lambda p: (f"A ZB-H1 pipeline of p = {p['p']} stages runs m = {p['m']} "
                        f"microbatches. Per stage, a forward takes F = {p['F']} ms, the input "
                        f"gradient B = {p['B']} ms and the weight gradient W = {p['W']} ms. "
                        "How many ms does each rank idle in one step, on paper? (In ms; "
                        "within 1%.)"),
        right=idle,
        wrong=[
            Wrong(lambda p: (p["p"] - 1) * (p["F"] + p["B"] + p["W"]),
                  "that is 1F1B's idle, (p-1)(F+B+W): ZB-H1 lets the B's run ahead and fills "
                  "the drain with delayed W's"),
            Wrong(lambda p: (p["p"] - 1) * (p["F"] + p["B"] - 2 * p["W"]),
                  "that is ZB-H2's (p-1)(F+B-2W), which holds up to 2p-1 microbatches; ZB-H1 "
                  "keeps 1F1B's memory and fills only one W per stage of the drain"),
            Wrong(lambda p: (p["p"] - 1) * (p["F"] + p["B"]),
                  "that splits the backward but moves no W: the late W's are what fill "
                  "(p-1)·W of the drain"),
        ],
        worked=lambda p: (
            f"(p-1)(F+B-W) = {p['p'] - 1} × ({p['F']} + {p['B']} - {p['W']}) = {idle(p)} ms "
            "(Qi et al. 2024, Table 2; `minitp.calc.pipeline_idle('zb-h1', ...)`, which "
            "`simulate` reproduces with these costs: a MODEL, no message latency). 1F1B "
            f"would idle (p-1)(F+B+W) = {(p['p'] - 1) * (p['F'] + p['B'] + p['W'])} ms."),
    )


def zb_h1_memory(seed=None) -> Question:
    def draw(rng):
        p = rng.choice((4, 8))
        return {"p": p, "r": rng.randrange(1, p), "m": p * rng.choice((2, 3)),
                "gib": rng.choice((1.5, 2.0, 3.0))}

    def held(p, schedule="zb-h1"):
        return simulate(schedule, p["p"], p["m"], costs=UNIT)["peak"][p["r"]]

    return Question(
        key="11.zb-h1-memory", seed=seed, draw=draw,
        text=lambda p: (f"A ZB-H1 pipeline of p = {p['p']} stages (from 0) runs m = {p['m']} "
                        f"microbatches. On stage r = {p['r']}, a microbatch keeps "
                        f"{p['gib']:g} GiB from its forward until its W pass (count it whole "
                        "until then, as the paper's bound does). How many GiB does that stage "
                        "hold at its peak? (In GiB; within 1%.)"),
        right=lambda p: held(p) * p["gib"],
        wrong=[
            Wrong(lambda p: (p["p"] - p["r"]) * p["gib"],
                  "that is 1F1B's peak on stage r, p-r: ZB-H1 keeps the first r microbatches "
                  "past their B, waiting for their delayed W"),
            Wrong(lambda p: (2 * p["p"] - 1) * p["gib"],
                  "that is ZB-H2's peak, 2p-1: it runs extra forwards in the warm-up; ZB-H1 "
                  "keeps 1F1B's order of forwards"),
            Wrong(lambda p: p["m"] * p["gib"],
                  "that is GPipe's peak, every microbatch at once"),
        ],
        worked=lambda p: (
            f"stage r holds 1F1B's p-r = {p['p'] - p['r']} microbatches between forward and "
            f"B, plus the r = {p['r']} whose W it delays: p = {held(p)} on every stage "
            f"(`simulate('zb-h1', ...)['peak']`), {held(p) * p['gib']:g} GiB — 1F1B's first "
            "stage's peak (Qi et al. 2024, Table 2: pM_B). An upper bound: between B and W "
            "a microbatch keeps only the linear layers' (x, g), as this lesson weighed."),
    )


def clip_sync(seed=None) -> Question:
    def draw(rng):
        return {"p": rng.choice((4, 8, 16)), "clip": rng.choice((0.5, 1.0, 2.0))}

    return Question(
        key="11.clip-sync", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"You train with ZB-H2 on p = {p['p']} stages and clip the gradients' "
                        f"global norm to {p['clip']:g}, as one device would. The all-reduce of "
                        "the norm makes every stage wait for the last one before it may step, "
                        "which brings the bubble back. Which change removes that wait and "
                        "still trains exactly as one device? Answer 'a', 'b', 'c' or 'd': "
                        "(a) each stage clips by the norm of its own gradients, no all-reduce; "
                        "(b) every stage steps at once, the norm is reduced meanwhile, and the "
                        "rare step that should have clipped (or met a NaN) is rolled back and "
                        "redone; (c) clip by the previous step's global norm, known already; "
                        "(d) each rank sums the squares of every gradient it holds and the "
                        "all-reduce moves to the next step's warm-up."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "a stage's own norm is smaller than the global one and "
                                 "different on every stage: the stages scale their gradients "
                                 "differently, so the update is not one device's"),
            Wrong(lambda p: "c", "the previous step's norm is not this step's: a step with a "
                                 "large gradient would go through unclipped"),
            Wrong(lambda p: "d", "a per-rank sum counts tp-replicated parameters and the tied "
                                 "embedding more than once, and moving the all-reduce later "
                                 "still leaves the step waiting for it"),
        ],
        worked=lambda p: (
            "post-validation (Qi et al. 2024, §4): clipping and NaNs are rare in stable "
            "training, so each stage steps as soon as its last W is done, assuming no clip; "
            "the global norm is reduced meanwhile and checked after; when the check fails, "
            "the step is rolled back and redone with the right scale. Exact, and no stage "
            "waits. minitp does not implement it: `train_step(clip_grad=...)` waits for the "
            "all-reduce."),
    )


QUESTIONS = {"11.zb-h1-idle": zb_h1_idle, "11.zb-h1-memory": zb_h1_memory,
             "11.clip-sync": clip_sync}
