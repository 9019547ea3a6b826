"""Lesson 10's questions: the interleaved bubble, the activations a 1F1B stage holds, and
which schedule halves the bubble while staying synchronous."""

from __future__ import annotations

from ...calc.flops import bubble as bubble_fraction
from ...pipeline.schedules import SCHEDULES
from .form import Question, Wrong


def bubble(seed=None) -> Question:
    def draw(rng):
        p = rng.choice((4, 8))  # p > 2 keeps p/(v·m) apart from (p-1)/m
        return {"p": p, "m": p * rng.choice((2, 4, 8)), "v": rng.choice((2, 3, 4))}

    return Question(
        key="10.bubble", seed=seed, draw=draw,
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
        key="10.in-flight", seed=seed, draw=draw,
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
        p = rng.choice((4, 8, 16))
        return {"p": p, "m": p * rng.choice((2, 4))}

    return Question(
        key="10.halve-bubble", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A 1F1B pipeline of p = {p['p']} stages runs m = {p['m']} "
                        "microbatches per step, with the flush. You want half its bubble, "
                        "the same global batch, and training that stays exactly synchronous "
                        "SGD (the same result as one device). Which change? Answer 'a', 'b', "
                        "'c' or 'd': (a) switch to GPipe; (b) interleaved 1F1B with v = 2 "
                        "chunks per rank; (c) PipeDream: 1F1B without the flush, weights "
                        "stashed; (d) twice as many stages, p = "
                        f"{2 * p['p']}."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "GPipe has the same bubble as 1F1B, (p-1)/m; it only holds "
                                 "more activations (m microbatches instead of p-r)"),
            Wrong(lambda p: "c", "PipeDream has no bubble after the first fill, but each "
                                 "stage's gradient is taken at stale weights of a different "
                                 "age: a different optimiser, no longer synchronous SGD"),
            Wrong(lambda p: "d", "more stages make the bubble larger: (2p-1)/m, not half of "
                                 "(p-1)/m"),
        ],
        worked=lambda p: (
            f"interleaving with v = 2 makes each unit half as long, so the fill and drain "
            f"shrink: (p-1)/(v·m) = {bubble_fraction(p['p'], p['m'], 2):.4f} instead of "
            f"{bubble_fraction(p['p'], p['m']):.4f} (`minitp.calc.bubble`, a MODEL), and "
            "the result is still exact: a schedule only reorders work. The price: twice the "
            "messages between stages, and m must stay divisible by p."),
    )


QUESTIONS = {"10.bubble": bubble, "10.in-flight": in_flight, "10.halve-bubble": halve_bubble}
