"""Lesson 09's questions: the bytes Ulysses' all-to-alls send when tp has left fewer K/V
heads than cp ranks, the ring's bytes over the all-to-all's, and which context
parallelism a Llama 3 model with tp = 8 should use."""

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
        key="09.a2a-bytes", seed=seed, draw=draw,
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
        key="09.ring-over-a2a", seed=seed, draw=draw,
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
            "6·n_kv heads of s/c·c = s positions whatever c; the all-to-all's fall as 1/c."),
    )


def pick(seed=None) -> Question:
    def draw(rng):
        name, heads, kv, d = rng.choice(LLAMA3)
        return {"name": name, "heads": heads, "kv": kv, "d": d, "c": rng.choice((8, 16)),
                "s": 131072}

    return Question(
        key="09.pick", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"{p['name']} ({p['heads']} query heads, {p['kv']} K/V heads) trains "
                        f"on s = {p['s']:,} tokens with tensor parallelism t = 8 inside each "
                        f"node and c = {p['c']} context-parallel ranks. Which attention sends "
                        "the fewest bytes per GPU, forward and backward, among those minitp "
                        "can run? Answer 'a', 'b', 'c' or 'd': (a) cp_comm='ring'; (b) "
                        "cp_comm='allgather'; (c) cp_comm='a2a'; (d) cp_comm='a2a+ring', "
                        f"cp_a2a_size={p['c'] // 2}."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "the ring sends each K and V block c-1 hops forward and "
                                 "again backward with dK, dV c hops: 2(3c-2) blocks, where "
                                 "the all-gather sends K and V to the c-1 others once each "
                                 "way: 4(c-1)"),
            Wrong(lambda p: "c", "after t = 8 a GPU holds h/8 query heads and one K/V head: "
                                 "where c exceeds the query heads the all-to-all cannot "
                                 "split them at all, and where it can it sends Q and O, "
                                 "h/8 heads each, where the all-gather sends one K/V head"),
            Wrong(lambda p: "d", "where the hybrid runs at all (U must divide the h/8 query "
                                 "heads), its all-to-all still sends Q and O, h/8 heads "
                                 "against one K/V head, and its ring adds K and V over the "
                                 "c/U groups"),
        ],
        worked=lambda p: (
            f"t = 8 leaves {p['heads'] // 8} query heads and 1 K/V head a GPU. In units of "
            f"one K/V head at s/c positions (model: `minitp.rules.cp_attention_bytes`): "
            f"ring 2(3c-2) = {2 * (3 * p['c'] - 2)}; all-gather 4(c-1) = {4 * (p['c'] - 1)}; "
            + (f"a2a 2·(c-1)/c·(2·{p['heads'] // 8} + 2·{p['c']}) = "
               f"{2 * (p['c'] - 1) / p['c'] * (2 * p['heads'] // 8 + 2 * p['c']):.0f}"
               if (p["heads"] // 8) % p["c"] == 0 else
               f"a2a refused ({p['heads'] // 8} heads over {p['c']} ranks)")
            + "; the hybrid pays an all-to-all of Q and O and a ring on top. With grouped-"
            "query attention K and V are small beside Q and O: the all-gather wins on bytes "
            "(Llama 3's own choice, Dubey et al. 2024, Section 3.3.2), at the cost of "
            "keeping K and V whole for backward."),
    )


QUESTIONS = {"09.a2a-bytes": a2a_bytes, "09.ring-over-a2a": ring_over_a2a, "09.pick": pick}
