"""Lesson 18's questions: an expert's capacity per sequence, the all-to-all bytes of expert
parallelism, and the group the aux loss's statistics are summed over (a design decision)."""

from __future__ import annotations

import itertools
import math

from ...calc.comm import moe_all_to_all_bytes
from ...model.routing import capacity
from .form import Question, Wrong

MB = 10**6


def _capacities(f, T, k, E, B):
    return {"right": capacity(f, T, k, E), "no-k": math.ceil(f * T / E),
            "no-f": math.ceil(T * k / E), "floor": math.floor(f * T * k / E),
            "batch": capacity(f, B * T, k, E)}


# Draws whose five candidate answers are all different (so each mistake can be told).
CAPACITY_DRAWS = tuple(
    (f, T, k, E, B) for f, T, k, E, B in itertools.product(
        (1.0, 1.25, 1.5), (100, 250, 1000, 4096), (1, 2, 8), (6, 16, 64), (4, 8))
    if k < E and len(set(_capacities(f, T, k, E, B).values())) == 5)


def capacity_question(seed=None) -> Question:
    def draw(rng):
        f, T, k, E, B = rng.choice(CAPACITY_DRAWS)
        return {"f": f, "T": T, "k": k, "E": E, "B": B}

    def value(p, which="right"):
        return _capacities(p["f"], p["T"], p["k"], p["E"], p["B"])[which]

    return Question(
        key="18.capacity", seed=seed, draw=draw, rel_tol=1e-9,  # a whole number: exact
        text=lambda p: (f"A mixture of experts routes each token to k = {p['k']} of "
                        f"E = {p['E']} experts, with capacity factor f = {p['f']}. A batch "
                        f"holds B = {p['B']} sequences of T = {p['T']} tokens. With minitp's "
                        "rule (`minitp.model.routing`: the capacity is counted per sequence), how "
                        "many of one sequence's assignments can one expert take at most?"),
        right=value,
        wrong=[
            Wrong(lambda p: value(p, "no-k"),
                  "that leaves out k: a sequence makes k·T assignments, not T"),
            Wrong(lambda p: value(p, "no-f"),
                  "that leaves out the capacity factor f: it scales the fair share k·T/E"),
            Wrong(lambda p: value(p, "floor"),
                  "that rounds down: C = ⌈f·T·k/E⌉ rounds up, so the fair share always fits"),
            Wrong(lambda p: value(p, "batch"),
                  "that is a capacity for the whole batch: minitp counts it per sequence, so "
                  "that a mesh splitting the batch over ranks applies the same rule"),
        ],
        worked=lambda p: (
            f"C = ⌈f·T·k/E⌉ = ⌈{p['f']}·{p['T']}·{p['k']}/{p['E']}⌉ = "
            f"⌈{p['f'] * p['T'] * p['k'] / p['E']:g}⌉ = {value(p)} "
            "(`minitp.model.routing.capacity`). "
            "The sequence's k·T assignments queue slot by slot (every token's first choice in "
            "position order, then every second choice); an assignment past an expert's "
            f"{value(p)}th is dropped."),
    )


def a2a_bytes(seed=None) -> Question:
    # k = 1, 2 and 4 are left out: without k the answer would be the right one (k = 1), or
    # equal to counting the forward only (k = 2), or to another mistake.
    def draw(rng):
        return {"tokens": rng.choice((4096, 8192, 16384)), "d": rng.choice((4096, 7168)),
                "k": rng.choice((6, 8)), "ep": rng.choice((8, 16, 64))}

    def mb(p, k=None, ep_fraction=True, passes=2):
        tokens, d, ep = p["tokens"], p["d"], p["ep"]
        both = moe_all_to_all_bytes(tokens, k or p["k"], d, ep, 2)["per_layer_step"]
        if not ep_fraction:
            both = both * ep / (ep - 1)
        return both * passes / 2 / MB

    return Question(
        key="18.a2a-bytes", seed=seed, draw=draw,
        text=lambda p: (f"Expert parallelism over ep = {p['ep']} ranks. Each rank routes its "
                        f"{p['tokens']:,} tokens to k = {p['k']} experts each, d = {p['d']}, "
                        "bf16 (2 bytes a value). Routing is uniform: every expert gets as "
                        "many rows as the others, nothing is dropped. How many MB (10⁶ bytes) "
                        "does one rank send in one MoE layer's dispatch and combine "
                        "all-to-alls, forward and backward together (leave out the small "
                        "counts table)?"),
        right=mb,
        wrong=[
            Wrong(lambda p: mb(p, ep_fraction=False),
                  "that counts every row as sent; the rows for this rank's own experts stay "
                  "here: only (ep-1)/ep of them cross"),
            Wrong(lambda p: mb(p, passes=1),
                  "that is the forward only; backward sends every row's gradient back the "
                  "way the row came: dispatch and combine again"),
            Wrong(lambda p: mb(p, k=1),
                  "that sends each token once; a token goes to k experts, k rows of d values"),
        ],
        worked=lambda p: (
            f"rows out per all-to-all: tokens·k·(ep-1)/ep = {p['tokens']}·{p['k']}·"
            f"{p['ep'] - 1}/{p['ep']} = {p['tokens'] * p['k'] * (p['ep'] - 1) / p['ep']:,.0f}, "
            f"each d·2 = {2 * p['d']:,} bytes: {mb(p) / 4:,.2f} MB. Four all-to-alls a layer "
            f"a step (dispatch and combine, forward and backward): {mb(p):,.2f} MB "
            "(`calc.moe_all_to_all_bytes(...)['per_layer_step']` with no counts, a MODEL)."),
    )


LETTERS = "abcde"  # none, tp, cp, tp and cp, all dp×cp


def stats_group(seed=None) -> Question:
    def draw(rng):
        return {"dp": rng.choice((2, 4)), "tp": rng.choice((2, 4)), "cp": rng.choice((2, 4)),
                "sp": rng.choice((True, False))}

    def right(p):
        return "d" if p["sp"] else "c"

    def swapped(p):
        return "c" if p["sp"] else "d"

    return Question(
        key="18.stats-group", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A mesh of dp = {p['dp']}, tp = {p['tp']}, cp = {p['cp']}, "
                        f"{'with' if p['sp'] else 'without'} sequence parallelism, trains a "
                        "mixture of experts balanced by the Switch aux loss, computed per "
                        "sequence (E·Σ f_e·P_e of each sequence's own tokens). Before a rank "
                        "computes it, over which other ranks must it sum its statistics "
                        "(counts and score sums) so that every mesh gives one device's loss? "
                        "(a) none: each rank's statistics are enough; (b) the tp group; (c) "
                        "the cp group; (d) the tp and cp groups; (e) all dp×cp ranks."),
        right=right,
        wrong=[
            Wrong(lambda p: "a",
                  "local statistics: with a sequence split over ranks, each rank sees only "
                  "part of it, and E·Σ f_e·P_e of the parts is not the whole's (it is not "
                  "linear in the tokens)"),
            Wrong(lambda p: "e",
                  "that is the group of the expert bias's load (a per-step count); the aux "
                  "loss is per sequence, and other dp ranks hold other sequences"),
            Wrong(swapped,
                  "look at the tp ranks again: with sequence parallelism each holds its own "
                  "slice of the sequence (sum over them); without it they hold the same "
                  "tokens, and summing would count each one tp times"),
        ],
        worked=lambda p: (
            "sum over the ranks that hold the other parts of the same sequences. cp splits "
            "every sequence into chunks; "
            + ("sequence parallelism also splits each one over the tp ranks: the tp and cp "
               "groups (d)." if p["sp"] else
               "without sequence parallelism the tp ranks hold the same tokens: the cp group "
               "only (c).")
            + " The other dp ranks hold other sequences. (minitp.expert_parallel.plan's "
              "`SplitSequence`; lesson 18 computes the difference.)"),
    )


QUESTIONS = {"18.capacity": capacity_question, "18.a2a-bytes": a2a_bytes,
             "18.stats-group": stats_group}
