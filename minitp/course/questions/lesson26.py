"""Lesson 26's questions: an expert's capacity per sequence, the all-to-all bytes of expert
parallelism, and which ranks a balancing statistic is summed over on a given mesh."""

from __future__ import annotations

import itertools
import math

from ...calc.network.comm import moe_all_to_all_bytes
from ...model.routing import capacity
from ...runtime.mesh import layout
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
        key="26.capacity", seed=seed, draw=draw, rel_tol=1e-9,  # a whole number: exact
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
        key="26.a2a-bytes", seed=seed, draw=draw,
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


MESHES = ((2, 2, 2), (2, 2, 4), (2, 4, 2), (4, 2, 2))  # (dp, cp, tp): 8 or 16 ranks
STATS = {"aux": "the Switch aux loss, computed per sequence (E·Σ f_e·P_e of each sequence's "
                "own tokens): its counts and score sums",
         "bias": "DeepSeek-V3's expert bias, moved after every step by each expert's load: "
                 "its load counts"}


def _groups(p) -> dict[str, list[int]]:
    """The candidate groups of rank r, each the ranks it would sum with (r included)."""
    g = layout(dp=p["dp"], tp=p["tp"], cp=p["cp"])
    r = p["rank"]

    def of(name):
        return next(group for group in g[name] if r in group)

    return {"cp": of("cp"), "tp": of("tp"), "dp": of("dp"), "dp_cp": of("dp_cp"),
            "cp_tp": sorted({x for t in of("tp") for x in next(c for c in g["cp"] if t in c)}),
            "all": list(range(p["dp"] * p["cp"] * p["tp"]))}


def _names(p) -> dict[str, str]:
    """What each letter would be: the right group, the swapped sp case, the other
    statistic's group, the tp group and the dp group."""
    aux, bias = ("cp_tp", "all") if p["sp"] else ("cp", "dp_cp")
    aux_swapped, bias_swapped = ("cp", "dp_cp") if p["sp"] else ("cp_tp", "all")
    if p["stat"] == "aux":
        roles = {"right": aux, "swapped": aux_swapped, "other": bias}
    else:
        roles = {"right": bias, "swapped": bias_swapped, "other": aux}
    roles.update(tp="tp", dp="dp")
    return roles


def stats_group(seed=None) -> Question:
    def draw(rng):
        dp, cp, tp = rng.choice(MESHES)
        order = ["right", "swapped", "other", "tp", "dp"]
        rng.shuffle(order)
        return {"dp": dp, "cp": cp, "tp": tp, "sp": rng.choice((True, False)),
                "stat": rng.choice(tuple(STATS)), "rank": rng.randrange(dp * cp * tp),
                "order": order}

    def letter(p, role):
        return "abcde"[p["order"].index(role)]

    def text(p):
        groups, names = _groups(p), _names(p)
        options = "; ".join(f"({letter(p, role)}) {groups[names[role]]}" for role in
                            sorted(p["order"], key=lambda role: letter(p, role)))
        return (f"minitp's `Mesh(dp={p['dp']}, cp={p['cp']}, tp={p['tp']})` on "
                f"{p['dp'] * p['cp'] * p['tp']} ranks, {'with' if p['sp'] else 'without'} "
                "sequence parallelism, trains a mixture of experts balanced by "
                f"{STATS[p['stat']]}. With which ranks (itself included) must rank "
                f"{p['rank']} sum those statistics before it uses them, so that the mesh "
                f"trains what one device trains? {options}. Answer the letter.")

    why = {
        "swapped": "look at the tp ranks again: with sequence parallelism each holds its own "
                   "slice of the sequences (sum over them too); without it they hold the same "
                   "tokens, and summing would count each one tp times",
        "other": "that is the other statistic's group: the aux loss's statistics are per "
                 "sequence (the ranks holding the rest of its sequences), the bias's load is "
                 "per step (every rank that saw other tokens, other dp ranks' included)",
        "tp": "that is its tp group alone: the cp ranks hold the rest of its tokens",
        "dp": "that is its dp group, ranks at the same place of other sequences: it leaves "
              "out the cp ranks that hold the rest of its own",
    }

    def worked(p):
        groups, names = _groups(p), _names(p)
        rule = ("the aux loss is per sequence: sum over the ranks holding the other parts of "
                "the rank's sequences, its cp group" if p["stat"] == "aux" else
                "the bias's load is per step: sum over every rank that saw other tokens, dp×cp")
        tp = (", and its tp group, as sequence parallelism gives each tp rank its own slice"
              if p["sp"] else "; not over tp, whose ranks hold the same tokens without "
              "sequence parallelism")
        return (f"{rule}{tp}. In minitp's layout (tp fastest, then cp, then dp; "
                f"`mt.layout(dp={p['dp']}, tp={p['tp']}, cp={p['cp']})`) rank {p['rank']}'s "
                f"cp group is {groups['cp']}, its tp group {groups['tp']}, its dp×cp group "
                f"{groups['dp_cp']}: ({letter(p, 'right')}) {groups[names['right']]}. "
                "(minitp/expert_parallel/plan.py; lesson 26 computes why.)")

    return Question(
        key="26.stats-group", seed=seed, draw=draw, kind="choice", text=text,
        right=lambda p: letter(p, "right"),
        wrong=[Wrong(lambda p, role=role: letter(p, role), why[role]) for role in
               ("swapped", "other", "tp", "dp")],
        worked=worked,
    )


QUESTIONS = {"26.capacity": capacity_question, "26.a2a-bytes": a2a_bytes,
             "26.stats-group": stats_group}
