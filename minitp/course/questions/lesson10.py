"""Lesson 10's questions: the bytes Ulysses' all-to-alls send when tp has left fewer K/V
heads than cp ranks, the ring's bytes over the all-to-all's, and which context
parallelism, as Megatron-LM and TransformerEngine run them, sends least for a Llama 3 model
at a given c."""

from __future__ import annotations

from ...rules import cp_attention_bytes
from .form import Question, Wrong

# (name, query heads, K/V heads, model dimension): Meta, "The Llama 3 Herd of Models"
# (Dubey et al. 2024), Table 3
LLAMA3 = (("Llama 3 8B", 32, 8, 4096), ("Llama 3 70B", 64, 8, 8192),
          ("Llama 3 405B", 128, 8, 16384))
MiB = 2**20


def _a2a(p, heads, kv, fwd_only=False, own_part=False):
    """Bytes one GPU's all-to-alls send: Q, K, V in and O out (backward: the same four),
    each tensor `heads` (Q, O) or `kv` (K, V) heads of s/c positions, bf16."""
    c = p["c"]
    local = p["s"] // c * p["d"] // p["heads"] * 2  # one head at this rank's positions
    share = 1 if own_part else (c - 1) / c  # all but the rank's own 1/c leaves it
    one_way = share * (2 * heads + 2 * kv) * local
    return one_way if fwd_only else 2 * one_way


def a2a_bytes(seed=None) -> Question:
    def draw(rng):
        # tp leaves fewer K/V heads than cp ranks in every draw: the all-to-all must copy them
        name, heads, kv, d = rng.choice(LLAMA3[:2])
        tp, c = rng.choice(((4, 4), (4, 8), (8, 2), (8, 4)) if heads == 32 else
                           ((2, 8), (4, 4), (4, 8), (8, 2), (8, 4), (8, 8)))
        return {"name": name, "heads": heads, "kv": kv, "d": d, "tp": tp, "c": c,
                "s": rng.choice((32768, 65536, 131072))}

    def kv_here(p):  # K/V heads on one tp rank: split over tp, or one copy each
        return max(p["kv"] // p["tp"], 1)

    def right(p):
        return _a2a(p, p["heads"] // p["tp"], p["c"]) / MiB  # K/V widened to c heads

    return Question(
        key="10.a2a-bytes", seed=seed, draw=draw,
        text=lambda p: (f"{p['name']} ({p['heads']} query heads, {p['kv']} K/V heads, "
                        f"model dimension {p['d']}) trains on sequences of s = {p['s']:,} "
                        f"tokens (micro-batch 1, bfloat16) with tensor parallelism t = "
                        f"{p['tp']} and Ulysses context parallelism (cp_comm='a2a') over "
                        f"c = {p['c']} ranks. How many MiB does one GPU send for one "
                        "layer's attention all-to-alls, forward and backward together? "
                        "(MiB; within 1%.)"),
        right=right,
        wrong=[
            Wrong(lambda p: right(p) / 2, "that is the forward alone: backward sends dO in "
                                          "and dQ, dK, dV out, as much again"),
            Wrong(lambda p: _a2a(p, p["heads"] // p["tp"], kv_here(p)) / MiB,
                  "the K/V heads a tp rank holds are fewer than the all-to-all's ranks: "
                  "each is copied to the ranks whose query heads read it, so K and V go "
                  "as c heads, one a rank"),
            Wrong(lambda p: _a2a(p, p["heads"] // p["tp"], p["c"], own_part=True) / MiB,
                  "a rank keeps its own 1/c of each tensor: only (c-1)/c of it is sent"),
            Wrong(lambda p: _a2a(p, p["heads"], p["c"]) / MiB,
                  "tensor parallelism splits the heads first: a GPU holds h/t query heads"),
        ],
        worked=lambda p: (
            f"a GPU holds h/t = {p['heads'] // p['tp']} query heads and "
            f"{kv_here(p)} K/V head(s) (n_kv/t, or one copy); c = {p['c']} is more than "
            f"that, so K and V are widened to c heads, one a rank. One head at a rank's "
            f"s/c = {p['s'] // p['c']:,} positions is {p['s'] // p['c']}·"
            f"{p['d'] // p['heads']}·2 bytes. Forward: Q, K, V in and O out, each sending "
            f"(c-1)/c of it; backward the same four: 2·(c-1)/c·(2·{p['heads'] // p['tp']} + "
            f"2·{p['c']}) heads' worth = {right(p):,.1f} MiB per layer "
            f"(`minitp.rules.cp_attention_bytes`, a MODEL; the lesson's trace counted "
            "these four all-to-alls each way)."),
    )


def ring_over_a2a(seed=None) -> Question:
    def draw(rng):
        name, heads, kv, d = rng.choice(LLAMA3)
        c = rng.choice((16, 32))  # above the 8 K/V heads: the all-to-all copies them
        return {"name": name, "heads": heads, "kv": kv, "d": d, "c": c, "s": 131072}

    def model(p, comm):
        b = cp_attention_bytes(comm, rows=1, seq_len=p["s"], heads=p["heads"],
                               kv_heads=p["kv"], head_dim=p["d"] // p["heads"], cp=p["c"])
        return b["fwd"] + b["bwd"]

    def ring(p, hops):  # messages of one rank's K or V, s/c positions of n_kv heads
        return hops * p["kv"]

    def a2a_heads(p, kv):  # heads' worth an all-to-all rank sends, forward and backward
        return 2 * (p["c"] - 1) / p["c"] * (2 * p["heads"] + 2 * kv)

    def right(p):
        return model(p, "ring") / model(p, "a2a")

    c_kv = lambda p: p["kv"] if p["kv"] % p["c"] == 0 else p["c"]  # noqa: E731
    return Question(
        key="10.ring-over-a2a", seed=seed, draw=draw,
        text=lambda p: (f"{p['name']} ({p['heads']} query heads, {p['kv']} K/V heads) trains "
                        f"on s = {p['s']:,} tokens with c = {p['c']} context-parallel ranks "
                        "and no tensor parallelism. Per GPU and layer, forward and backward "
                        "together, how many times the bytes of Ulysses' all-to-alls "
                        "(cp_comm='a2a') does minitp's ring (cp_comm='ring') send? "
                        "(A ratio; within 1%.)"),
        right=right,
        wrong=[
            Wrong(lambda p: ring(p, 2 * (p["c"] - 1)) / (a2a_heads(p, c_kv(p)) / 2),
                  "that compares the forward passes alone: backward, the ring sends K and "
                  "V round again and dK, dV c hops, 2(3c-2) blocks in all; the all-to-alls "
                  "send as much backward as forward"),
            Wrong(lambda p: ring(p, 2 * (3 * p["c"] - 2)) / a2a_heads(p, p["kv"]),
                  "the all-to-all cannot split fewer K/V heads than ranks: it copies each "
                  "to the ranks whose query heads read it, c heads in all"),
            Wrong(lambda p: ring(p, 2 * (3 * p["c"] - 2)) / (2 * (p["c"] - 1) / p["c"]
                                                             * 2 * c_kv(p)),
                  "the all-to-alls carry Q and O too, the query heads' worth each way; "
                  "the ring carries only K and V"),
        ],
        worked=lambda p: (
            f"in units of one head at s/c positions: the ring sends n_kv = {p['kv']} heads "
            f"2(3c-2) = {2 * (3 * p['c'] - 2)} times ({ring(p, 2 * (3 * p['c'] - 2)):,}); "
            f"the all-to-alls send (c-1)/c of Q, K, V and O each way, K and V as "
            f"{c_kv(p)} heads: 2·(c-1)/c·(2·{p['heads']} + 2·{c_kv(p)}) = "
            f"{a2a_heads(p, c_kv(p)):,.1f}. Ratio {right(p):.2f} (a MODEL: "
            "`minitp.rules.cp_attention_bytes`). The ring's bytes per GPU stay near "
            "6·n_kv heads of s/c·c = s positions whatever c. " + _a2a_trend(p, c_kv(p))),
    )


def _a2a_trend(p, kv_sent) -> str:
    """How the all-to-all's bytes move with c: all of them fall as 1/c only while c
    divides the K/V heads; copied K/V (c heads of s/c positions) do not fall."""
    if kv_sent != p["c"] or p["kv"] % p["c"] == 0:
        return "The all-to-all's fall as 1/c: Q, O, K and V are all split c ways."
    c = p["c"]
    share = 2 * c / (2 * p["heads"] + 2 * c)  # K and V's part of the all-to-alls' bytes
    return (f"The all-to-all's Q and O fall as 1/c, but not its K and V: here c = {c} > "
            f"n_kv = {p['kv']}, so they travel as c copies, c heads of s/c positions, "
            f"4(c-1)/c = {4 * (c - 1) / c:.2f} heads' worth of all s positions whatever c "
            f"({share:.0%} of the all-to-alls' bytes here, a larger share as c grows).")


# Megatron-LM's four (--cp-comm-type p2p, allgather, a2a, a2a+p2p) as TransformerEngine
# runs them: its all-gather gathers K and V again in backward, minitp's "allgather-regather"
CHOICES = {"a": ("ring", None), "b": ("allgather-regather", None), "c": ("a2a", None),
           "d": ("a2a+ring", 2)}  # the hybrid's all-to-all over c/2 ranks (2: its ring)


def _sent(p, letter):
    """MODEL: bytes one GPU sends per layer (fwd + bwd) with option `letter`."""
    comm, ring = CHOICES[letter] if letter in CHOICES else (letter, None)
    b = cp_attention_bytes(comm, rows=1, seq_len=p["s"], heads=p["heads"], kv_heads=p["kv"],
                           head_dim=p["d"] // p["heads"], cp=p["c"],
                           cp_a2a_size=p["c"] // ring if ring else None)
    return b["fwd"] + b["bwd"]


def _one_least(model, c) -> bool:
    """Whether one option alone sends least (405B at c = 16 is a tie: the all-to-all over
    16 copies its 8 K/V heads to 16, the hybrid's over 8 splits them, the same bytes)."""
    name, heads, kv, d = model
    p = {"heads": heads, "kv": kv, "d": d, "c": c, "s": 131072}
    sent = sorted(_sent(p, letter) for letter in CHOICES)
    return sent[0] < sent[1]


# 70B is left out: the lesson's table prints its bytes per GPU at every c, so a 70B draw
# would be a lookup; 8B and 405B must be worked out from the variants' rules.
DRAWS = [(model, c) for model in LLAMA3 for c in (4, 8, 16, 32)
         if "70B" not in model[0] and _one_least(model, c)]


def pick(seed=None) -> Question:
    def draw(rng):
        (name, heads, kv, d), c = rng.choice(DRAWS)
        return {"name": name, "heads": heads, "kv": kv, "d": d, "c": c, "s": 131072}

    def right(p):
        return min(CHOICES, key=lambda letter: _sent(p, letter))

    def heads_worth(p, letter):  # in units of one head at s/c positions
        return _sent(p, letter) / (p["s"] // p["c"] * (p["d"] // p["heads"]) * 2)

    def kept(p):  # minitp's all-gather that keeps K and V: 2/3 of (b)'s bytes
        return heads_worth(p, "allgather")

    def flip(p):
        if kept(p) > min(heads_worth(p, letter) for letter in CHOICES):
            return ""
        if right(p) == "b":
            return (" minitp's all-gather that keeps K and V (cp_comm='allgather') would send "
                    f"less still: {kept(p):,.0f}.")
        return (f" Had the all-gather kept its K and V (minitp's cp_comm='allgather', "
                f"{kept(p):,.0f}), it would have sent least: the answer flips with the "
                "accounting.")

    return Question(
        key="10.pick", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"{p['name']} ({p['heads']} query heads, {p['kv']} K/V heads) trains "
                        f"on s = {p['s']:,} tokens without tensor parallelism, over c = "
                        f"{p['c']} context-parallel ranks, with Megatron-LM's attentions as "
                        "TransformerEngine runs them. Which sends the fewest bytes per GPU "
                        "and layer, forward and backward together? Answer 'a', 'b', 'c' or "
                        "'d': (a) p2p, the ring (cp_comm='ring'); (b) allgather, K and V "
                        "gathered again in backward (cp_comm='allgather-regather'); (c) a2a "
                        f"(cp_comm='a2a'); (d) a2a+p2p (cp_comm='a2a+ring', cp_a2a_size="
                        f"{p['c'] // 2})."),
        right=right,
        wrong=[
            Wrong(lambda p: "a", "the ring sends each K and V block 2(3c-2) times in all, "
                                 "two more than the all-gather's 6(c-1) when it gathers "
                                 "again in backward"),
            Wrong(lambda p: "c" if right(p) == "b" else "b",
                  "compare the two at this c: this all-gather sends n_kv heads' worth 6(c-1) "
                  "times (forward, again in backward, and the gradients' reduce-scatter), "
                  "growing with c; the all-to-all sends 2(c-1)/c·(2h + 2n_kv), Q and O "
                  "included and K/V copied to c heads where c exceeds them, falling with c"),
            Wrong(lambda p: "d", "the hybrid sends the all-to-all's Q and O over its U ranks "
                                 "and adds a ring of K and V over the c/U groups: at least "
                                 "as much as the plain all-to-all here"),
        ],
        worked=lambda p: (
            "in units of one head at s/c positions (MODEL: `minitp.rules.cp_attention_bytes`): "
            + ", ".join(f"({letter}) {CHOICES[letter][0]} {heads_worth(p, letter):,.0f}"
                        for letter in CHOICES)
            + f": ({right(p)}) sends least.{flip(p)} The all-gather's 6(c-1)·n_kv grows "
            "with c; the all-to-all's 2(c-1)/c·(2h + 2n_kv) tends to a constant (K/V copied "
            "to c heads once c exceeds them): the more ranks, the better the all-to-all, and "
            "the more query heads per K/V head, the later it wins. Bytes are not all: the "
            "ring hides its sends behind attention's compute, the others are paid whole."),
    )


QUESTIONS = {"10.a2a-bytes": a2a_bytes, "10.ring-over-a2a": ring_over_a2a, "10.pick": pick}
