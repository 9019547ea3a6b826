"""Lesson 11's questions: ZB-H1's idle time, the activations a ZB-H1 stage holds, and how
long a ZB-H2 stage waits for the global gradient norm before it may step."""

from __future__ import annotations

from ...calc.flops import pipeline_idle
from .form import Question, Wrong


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
                "mb": rng.choice((2.0, 3.0, 4.0)), "mw": rng.choice((0.5, 1.0, 1.5))}

    def held(p, before_b, before_w):  # GiB for so many microbatches before B, before W
        return before_b * p["mb"] + before_w * p["mw"]

    return Question(
        key="11.zb-h1-memory", seed=seed, draw=draw,
        text=lambda p: (f"A ZB-H1 pipeline of p = {p['p']} stages (from 0) runs m = {p['m']} "
                        f"microbatches. On stage r = {p['r']}, a microbatch's forward keeps "
                        f"{p['mb']:g} GiB of activations until its B pass; B frees them but "
                        "for the inputs and output gradients of its linear layers, "
                        f"{p['mw']:g} GiB, which stay until its W pass. How many GiB does "
                        "that stage hold at its peak? (In GiB; within 1%.)"),
        right=lambda p: held(p, p["p"] - p["r"], p["r"]),
        wrong=[
            Wrong(lambda p: held(p, p["p"], 0),
                  "that is the paper's bound pM_B, every microbatch counted whole until its "
                  "W: after its B a microbatch keeps only its linear layers' (x, g)"),
            Wrong(lambda p: held(p, p["p"] - p["r"], 0),
                  "that is 1F1B's peak on stage r, p-r microbatches between forward and B: "
                  "ZB-H1 also runs stage r's W's r microbatches late, and those r wait"),
            Wrong(lambda p: held(p, 2 * p["p"] - 1, 0),
                  "that is ZB-H2's peak, 2p-1 whole forwards: ZB-H1 keeps 1F1B's order of "
                  "forwards and B's"),
        ],
        worked=lambda p: (
            f"ZB-H1 keeps 1F1B's order of forwards and B's, so at the peak stage r holds "
            f"1F1B's p-r = {p['p'] - p['r']} microbatches between forward and B "
            f"({p['mb']:g} GiB each); and it runs each W r = {p['r']} microbatches late, "
            f"so {p['r']} more wait for their W ({p['mw']:g} GiB each): "
            f"{p['p'] - p['r']} × {p['mb']:g} + {p['r']} × {p['mw']:g} = "
            f"{held(p, p['p'] - p['r'], p['r']):g} GiB (Qi et al. 2024, §2.3: worker i of p "
            "holds (p-i+1)M_B + (i-1)M_W; this lesson's ledger weighed the same on every "
            f"stage). Table 2's bound pM_B = {held(p, p['p'], 0):g} GiB counts all p whole; "
            f"1F1B would hold {held(p, p['p'] - p['r'], 0):g} GiB."),
    )


def clip_sync(seed=None) -> Question:
    def draw(rng):
        # W < F <= B, as Qi et al.'s Table 1 counts a layer; B < 2W < F + B: some of
        # stage 0's idle falls inside its span, some after it (and the two differ)
        costs = [(f, b, w) for f in (4, 5, 6) for b in range(f, f + 3) for w in range(3, f)
                 if b < 2 * w < f + b and f + 2 * b != 4 * w]
        f, b, w = rng.choice(costs)
        p = rng.choice((4, 8, 16))
        return {"p": p, "m": 2 * p, "F": f, "B": b, "W": w}

    def wait(p):  # all of stage 0's idle, less the part inside its span
        return (p["p"] - 1) * p["F"] - (p["p"] - 1) * (p["F"] + p["B"] - 2 * p["W"])

    return Question(
        key="11.clip-sync", seed=seed, draw=draw,
        text=lambda p: (f"A ZB-H2 pipeline of p = {p['p']} stages runs m = {p['m']} "
                        f"microbatches; per stage a forward takes F = {p['F']} ms, the input "
                        f"gradient B = {p['B']} ms and the weight gradient W = {p['W']} ms. "
                        "The step clips by the global gradient norm, so no stage may step "
                        "before the norm's all-reduce, which needs every stage's last W (take "
                        "the all-reduce itself as instant). On paper, how many ms does stage "
                        "0 wait between the end of its last unit and its optimizer step? (In "
                        "ms; within 1%.)"),
        right=wait,
        wrong=[
            Wrong(lambda p: 0,
                  "ZB-H2's stages start (p-1)F apart and the last one ends last: stage 0 "
                  "waits for it, whatever idle there is inside a stage's span"),
            Wrong(lambda p: (p["p"] - 1) * p["F"],
                  "that is all the idle of stage 0 in the step, as if it all came at the "
                  "end: (p-1)(F+B-2W) of it falls inside its span, between its units"),
            Wrong(lambda p: (p["p"] - 1) * (p["F"] + p["B"] - 2 * p["W"]),
                  "that is the idle inside stage 0's span, Table 2's ZB-H2 bubble; the "
                  "wait is what is left of its (p-1)F after it"),
            Wrong(lambda p: (p["p"] - 1) * (p["F"] + p["B"] + p["W"]),
                  "that is 1F1B's drain, (p-1)(F+B+W): ZB-H2's extra forwards and late W's "
                  "fill most of it"),
        ],
        worked=lambda p: (
            f"the last stage starts (p-1)F = {(p['p'] - 1) * p['F']} ms after stage 0 (microbatch "
            "0's forward comes down the pipe) and then never idles, so the step lasts "
            "(p-1)F longer than any stage's work and every stage idles (p-1)F in it. Of stage "
            f"0's, Table 2's (p-1)(F+B-2W) = {(p['p'] - 1) * (p['F'] + p['B'] - 2 * p['W'])} "
            "ms falls inside its span (Qi et al. 2024); the rest comes after its last unit, "
            f"waiting for the last stage: (p-1)(2W-B) = {wait(p)} ms (`simulate('zb-h2', ...)` "
            "with these costs: a MODEL). Post-validation (Qi et al. 2024, §4) removes the "
            "wait: each stage steps under the partial norm it has, and the rare step the full "
            "norm contradicts is rolled back and redone; minitp does not implement it."),
    )


QUESTIONS = {"11.zb-h1-idle": zb_h1_idle, "11.zb-h1-memory": zb_h1_memory,
             "11.clip-sync": clip_sync}
