"""Lesson 11's questions: the interleaved bubble, the activations a 1F1B stage holds,
which change halves the bubble within a stage's memory and stays synchronous, and how many
layers the first of two stages holds when the head weighs several layers."""

from __future__ import annotations

from ...calc.counts.flops import bubble as bubble_fraction
from ...pipeline.schedules import SCHEDULES
from .form import Question, Wrong


def bubble(seed=None) -> Question:
    def draw(rng):
        p = rng.choice((4, 8))  # p > 2 keeps p/(v·m) apart from (p-1)/m
        return {"p": p, "m": p * rng.choice((2, 4, 8)), "v": rng.choice((2, 3, 4))}

    return Question(
        key="11.bubble", seed=seed, draw=draw,
        text=lambda p: (f"An interleaved 1F1B pipeline has p = {p['p']} stages, each rank "
                        f"holding v = {p['v']} chunks of layers, and runs m = {p['m']} "
                        "microbatches per step. What is its bubble: the idle time of a rank "
                        "as a fraction of its busy (useful) time, on paper? (A fraction such "
                        "as 0.25; within 1%.)"),
        right=lambda p: bubble_fraction(p["p"], p["m"], p["v"]),
        wrong=[
            Wrong(lambda p: (p["p"] - 1) / p["m"],
                  "that is GPipe's and plain 1F1B's bubble: interleaving makes every unit 1/v "
                  "as long, so the fill and drain take 1/v as long"),
            Wrong(lambda p: p["p"] / (p["v"] * p["m"]),
                  "the fill and drain take p-1 slots, not p: the first stage starts at once"),
            Wrong(lambda p: (p["p"] - 1) / (p["v"] * p["m"] + p["p"] - 1),
                  "that is the idle share of the whole step (idle over idle + busy); the "
                  "bubble is counted against the busy time alone"),
        ],
        worked=lambda p: (
            f"the fill and drain cost p-1 = {p['p'] - 1} unit slots, each unit 1/v of a "
            f"stage's layers, against m = {p['m']} microbatches of v = {p['v']} units each: "
            f"(p-1)/(v·m) = {p['p'] - 1}/{p['v'] * p['m']} = "
            f"{bubble_fraction(p['p'], p['m'], p['v']):.4f} (`minitp.calc.bubble`, which "
            "`simulate` reproduces tick for tick; a MODEL: the measured bubbles in this lesson "
            "sit above it, each hop adding latency). The price: v times the messages."),
    )


def in_flight(seed=None) -> Question:
    def draw(rng):
        p = rng.choice((4, 8))
        # a middle stage (not the first, not the last) and m >= 2p
        return {"p": p, "r": rng.randrange(1, p - 1), "m": p * rng.choice((2, 4)),
                "gib": rng.choice((1.5, 2.0, 3.0))}

    def peak(p, schedule="1f1b"):
        alive = most = 0
        for kind, _, _ in SCHEDULES[schedule](p["p"], p["r"], p["m"]):
            alive += 1 if kind == "F" else -1
            most = max(most, alive)
        return most

    return Question(
        key="11.in-flight", seed=seed, draw=draw,
        text=lambda p: (f"A pipeline of p = {p['p']} stages (from 0) runs m = {p['m']} "
                        "microbatches with the 1F1B schedule. On stage r = "
                        f"{p['r']}, one microbatch's forward keeps {p['gib']:g} GiB of "
                        "activations until its backward. How many GiB of activations does "
                        "that stage hold at its peak? (In GiB; within 1%.)"),
        right=lambda p: peak(p) * p["gib"],
        wrong=[
            Wrong(lambda p: p["m"] * p["gib"],
                  "that is GPipe's peak, every microbatch's forward before any backward; 1F1B "
                  "starts backwards after a warm-up, whatever m is"),
            Wrong(lambda p: p["p"] * p["gib"],
                  "that is the first stage's peak, p microbatches; stage r holds p-r"),
            Wrong(lambda p: (p["p"] - p["r"] - 1) * p["gib"],
                  "that counts the warm-up forwards only: the steady state runs one more "
                  "forward before the first backward"),
        ],
        worked=lambda p: (
            f"stage r runs p-r-1 = {p['p'] - p['r'] - 1} warm-up forwards, then one more "
            "before its first backward, and from then on one forward per backward: "
            f"p-r = {peak(p)} microbatches in flight at most (counted from "
            f"`minitp.pipeline.SCHEDULES['1f1b']`), {peak(p) * p['gib']:g} GiB. GPipe would "
            f"hold all m = {p['m']}, {peak(p, 'gpipe') * p['gib']:g} GiB."),
    )


def halve_bubble(seed=None) -> Question:
    def draw(rng):
        p = rng.choice((4, 8))
        # a middle stage; m >= 2p: GPipe's whole batch lies far above the stage's room
        return {"p": p, "r": rng.randrange(1, p - 1), "m": p * rng.choice((2, 4)),
                "b": rng.choice((4, 8, 16)), "gib": rng.choice((0.25, 0.5, 0.75))}

    def held(p, microbatches, b):  # GiB of activations on stage r at its peak
        return microbatches * b * p["gib"]

    def room(p):  # what 1F1B's stage r holds now: p - r microbatches of b sequences
        return held(p, p["p"] - p["r"], p["b"])

    return Question(
        key="11.halve-bubble", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A 1F1B pipeline of p = {p['p']} stages (from 0) trains on a global "
                        f"batch of {p['m'] * p['b']} sequences, cut into m = {p['m']} "
                        f"microbatches of {p['b']}. On stage r = {p['r']}, each sequence's "
                        f"forward keeps {p['gib']:g} GiB of activations until its backward, "
                        f"and the stage has room for {room(p):g} GiB of them. You want half "
                        "the bubble, the same global batch, training that stays exactly "
                        "synchronous SGD (one device's result), and no more than that room. "
                        "Which change? Answer 'a', 'b', 'c' or 'd': (a) GPipe over "
                        f"{2 * p['m']} microbatches of {p['b'] // 2}; (b) 1F1B over "
                        f"{2 * p['m']} microbatches of {p['b'] // 2}; (c) PipeDream: 1F1B "
                        "without the flush, weights stashed, the same microbatches; (d) "
                        f"p = {2 * p['p']} stages of half as many layers, the same "
                        "microbatches."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "GPipe's bubble is 1F1B's, (p-1)/m, so it halves too; but "
                                 "GPipe holds every microbatch until the backwards start, "
                                 "the whole batch's activations, far more than the room"),
            Wrong(lambda p: "c", "PipeDream has no bubble after the first fill, but each "
                                 "stage's gradient is taken at stale weights of a different "
                                 "age: a different optimiser, no longer synchronous SGD"),
            Wrong(lambda p: "d", "more stages make the bubble larger, (2p-1)/m, not half of "
                                 "(p-1)/m"),
        ],
        worked=lambda p: (
            f"the bubble (p-1)/m halves when m doubles, for GPipe as for 1F1B: "
            f"{bubble_fraction(p['p'], p['m']):.4f} -> "
            f"{bubble_fraction(p['p'], 2 * p['m']):.4f} (`minitp.calc.bubble`, a MODEL). The "
            f"memory decides: 1F1B's stage r holds p-r = {p['p'] - p['r']} microbatches "
            f"whatever m is, now of {p['b'] // 2} sequences: "
            f"{held(p, p['p'] - p['r'], p['b'] // 2):g} GiB, half its room of {room(p):g}. "
            f"GPipe would hold all {2 * p['m']}: "
            f"{held(p, 2 * p['m'], p['b'] // 2):g} GiB. The price of the smaller "
            "microbatches: smaller matrix multiplications, less efficient on an accelerator "
            "(interleaving halves the bubble too, keeping them, for twice the messages)."),
    )

def uneven_stages(seed=None) -> Question:
    def draw(rng):  # l + H even: one best split, and it differs from the even one
        return {"l": rng.choice((7, 9, 11, 13)), "H": rng.choice((3, 5))}

    def best(p):  # the stages cost k and l - k + H layers: the slower is least where equal
        return (p["l"] + p["H"]) // 2

    return Question(
        key="11.uneven-stages", seed=seed, draw=draw,
        text=lambda p: (f"A GPT of l = {p['l']} layers trains on p = 2 pipeline stages. The "
                        "first stage also holds the embedding (a lookup: no FLOPs to speak of), "
                        "the last the head, whose output projection over the vocabulary costs "
                        f"as much as H = {p['H']} layers (training FLOPs per token, a MODEL). "
                        "How many layers should the first stage hold so that the slower of the "
                        "two stages is as fast as it can be? (A whole number of layers.)"),
        right=best,
        wrong=[
            Wrong(lambda p: (p["l"] + 1) // 2,
                  "that splits the layers evenly (the extra one first) and forgets the head: "
                  "the last stage also runs H layers' worth, and every microbatch waits for it"),
            Wrong(lambda p: p["l"] - best(p),
                  "that is how many the last stage should hold: the head's stage gets fewer"),
            Wrong(lambda p: p["l"],
                  "with every layer on the first stage, it becomes the slow one"),
        ],
        worked=lambda p: (
            f"the stages cost k and l - k + H = {p['l'] + p['H']} - k layers; the slower of "
            f"the two is least where they are equal: k = (l + H)/2 = {best(p)}, the last stage "
            f"holding {p['l'] - best(p)} layers and the head. `mt.calc.pipeline_layout` finds "
            "the same by trying every split, with each stage's FLOPs from the model's shape "
            "(this lesson's 7 layers and a head of about 3: 5 and 2). Even, the pipeline "
            f"would move at {p['l'] - (p['l'] + 1) // 2 + p['H']} layers a microbatch, not "
            f"{best(p)}."),
    )


QUESTIONS = {"11.bubble": bubble, "11.in-flight": in_flight, "11.halve-bubble": halve_bubble,
             "11.uneven-stages": uneven_stages}
