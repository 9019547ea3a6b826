"""Lesson 12's questions: ZB-H1's idle time, the activations a ZB-H1 stage holds, and which
schedule gives the shortest step when the global gradient norm makes every stage wait."""

from __future__ import annotations

from ...calc.counts.flops import pipeline_idle
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
        key="12.zb-h1-idle", seed=seed, draw=draw,
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
        key="12.zb-h1-memory", seed=seed, draw=draw,
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
        # W < F <= B, as Qi et al.'s Table 1 counts a transformer layer; B <= 2W keeps
        # ZB-H2's idle inside a stage, (p-1)(F+B-2W), within the (p-1)F the step adds
        f, b, w = rng.choice([(f, f + db, f - dw) for f in (4, 5, 6) for db in (0, 1, 2)
                              for dw in (1, 2) if f + db <= 2 * (f - dw)])
        p = rng.choice((4, 8, 16))
        return {"p": p, "m": 2 * p, "F": f, "B": b, "W": w}

    def steps(p):  # ms per step: every stage's work, plus the idle of each schedule
        work = p["m"] * (p["F"] + p["B"] + p["W"])
        return {"1F1B": work + (p["p"] - 1) * (p["F"] + p["B"] + p["W"]),
                "ZB-H1": work + (p["p"] - 1) * (p["F"] + p["B"] - p["W"]),
                "ZB-H2": work + (p["p"] - 1) * p["F"]}

    return Question(
        key="12.clip-sync", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A pipeline of p = {p['p']} stages runs m = {p['m']} microbatches a "
                        f"step; per stage a forward takes F = {p['F']} ms, the input gradient "
                        f"B = {p['B']} ms and the weight gradient W = {p['W']} ms, and memory "
                        "allows ZB-H2's 2p-1 microbatches. The step clips by the global "
                        "gradient norm: no stage may step before the norm's all-reduce, which "
                        "needs every stage's last W (take the all-reduce as instant; no "
                        "post-validation). Which schedule gives the shortest step, on paper? "
                        "Answer 'a', 'b', 'c' or 'd': (a) 1F1B; (b) ZB-H1; (c) ZB-H2; (d) "
                        "ZB-H1 and ZB-H2 tie, the norm's wait taking back what ZB-H2 gained."),
        right=lambda p: "c",
        wrong=[
            Wrong(lambda p: "a", "1F1B idles (p-1)(F+B+W) per rank, the most of the three: "
                                 "nothing fills its drain"),
            Wrong(lambda p: "b", "ZB-H1's step is the work plus (p-1)(F+B-W); with the "
                                 "norm's wait ZB-H2's is the work plus (p-1)F, its stages "
                                 "starting and so ending (p-1)F apart: shorter when B > W"),
            Wrong(lambda p: "d", "they tie only when B = W: the wait makes ZB-H2's idle "
                                 "(p-1)F, not Table 2's (p-1)(F+B-2W), and ZB-H1's is "
                                 "(p-1)(F+B-W)"),
        ],
        worked=lambda p: (
            "each stage works m(F+B+W) per step; with the norm's all-reduce the step ends when "
            "the last stage does, so each schedule adds its idle per rank: 1F1B "
            "(p-1)(F+B+W), ZB-H1 (p-1)(F+B-W) (Qi et al. 2024, Table 2), ZB-H2 (p-1)F — its "
            "stages start (p-1)F apart, so they end that far apart, and the wait turns its "
            "Table 2 bubble (p-1)(F+B-2W) back into (p-1)F. Here: "
            + ", ".join(f"{k} {v} ms" for k, v in steps(p).items())
            + f". ZB-H2 still wins, by (p-1)(B-W) = {(p['p'] - 1) * (p['B'] - p['W'])} ms; "
            "with F = B = W it would only tie ZB-H1 (this lesson's timed run). "
            "Post-validation (Qi et al. 2024, §4) removes the wait; minitp does not implement "
            "it. A MODEL: `simulate` with these costs plays the same."),
    )


QUESTIONS = {"12.zb-h1-idle": zb_h1_idle, "12.zb-h1-memory": zb_h1_memory,
             "12.clip-sync": clip_sync}
