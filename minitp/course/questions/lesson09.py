"""Lesson 09's questions: the ring's bytes with grouped-query attention, the K/V weight a
tensor-parallel rank holds when tp is above the K/V heads, and the positions a
context-parallel rank must rotate by."""

from __future__ import annotations

from types import SimpleNamespace

from ...calc.network.comm import cp_comm_bytes
from .form import Question, Wrong

# (name, n_head, n_kv, d_model): Llama 3's 8B and 70B (Meta, "The Llama 3 Herd of Models"
# 2024, Table 3: 32 and 64 query heads, 8 K/V heads, model dimension 4096 and 8192)
MODELS = (("Llama 3 8B", 32, 8, 4096), ("Llama 3 70B", 64, 8, 8192))


def _cfg(n_head, n_kv, d, seq):
    return SimpleNamespace(n_head=n_head, kv_heads=n_kv, head_dim=d // n_head,
                           seq_len=seq, d_model=d)


def ring_bytes(seed=None) -> Question:
    def draw(rng):
        name, heads, kv, d = rng.choice(MODELS)
        return {"name": name, "heads": heads, "kv": kv, "d": d, "seq": rng.choice((8192, 16384)),
                "cp": rng.choice((2, 4, 8))}

    def mib(p, kv=None):
        cfg = _cfg(p["heads"], p["kv"] if kv is None else kv, p["d"], p["seq"])
        return cp_comm_bytes(cfg, 1, p["cp"], 1, bytes_per_value=2) / 2**20

    return Question(
        key="09.ring-bytes", seed=seed, draw=draw,
        text=lambda p: (f"{p['name']} ({p['heads']} query heads, {p['kv']} K/V heads, "
                        f"d_model {p['d']}) trains on sequences of {p['seq']} tokens split over "
                        f"cp = {p['cp']} ranks by minitp's ring attention (load-balanced), one "
                        "sequence a microbatch, bf16, no tensor parallelism. How many MiB does "
                        "one rank send for the ring in one layer, forward and backward, per "
                        "microbatch? (In MiB; within 1%.)"),
        right=mib,
        wrong=[
            Wrong(lambda p: mib(p, p["heads"]),
                  "that is with a K/V head per query head: the ring would carry K and V widened "
                  "to the query heads, which minitp's ring does not (it widens each block as it "
                  "computes)"),
            Wrong(lambda p: mib(p) * 2 * (p["cp"] - 1) / (2 * (3 * p["cp"] - 2)),
                  "that is the forward's sends only; backward passes K and V again and the "
                  "dK/dV accumulators a full turn home"),
            Wrong(lambda p: mib(p) * 4 * (p["cp"] - 1) / (2 * (3 * p["cp"] - 2)),
                  "that is K and V forward and backward, without the dK/dV accumulators, which "
                  "travel a full turn (cp hops) to come home to their owner"),
        ],
        worked=lambda p: (
            f"each message is one rank's K or V: (s/cp)·n_kv·d_head values = {p['seq']}/{p['cp']}"
            f" × {p['kv']} × {p['d'] // p['heads']} × 2 bytes; 2(3cp−2) = "
            f"{2 * (3 * p['cp'] - 2)} messages: {mib(p):.2f} MiB (`mt.calc.cp_comm_bytes`, a "
            f"MODEL the trace matches in the lesson). With a K/V head per query head it would "
            f"be {mib(p, p['heads']):.2f} MiB: n_head/n_kv = {p['heads'] // p['kv']} times."),
    )


def kv_weight(seed=None) -> Question:
    def draw(rng):
        name, heads, kv, d = rng.choice(MODELS)
        return {"name": name, "heads": heads, "kv": kv, "d": d, "tp": rng.choice((16, 32))}

    def mib(p):  # the whole K/V projection on every rank: 2·n_kv·d_head·d, bf16
        return 2 * p["kv"] * (p["d"] // p["heads"]) * p["d"] * 2 / 2**20

    return Question(
        key="09.kv-weight", seed=seed, draw=draw,
        text=lambda p: (f"{p['name']} ({p['heads']} query heads, {p['kv']} K/V heads of "
                        f"{p['d'] // p['heads']}, d_model {p['d']}) runs at tp = {p['tp']}, "
                        "above its K/V heads, as minitp runs it (the whole K/V projection "
                        "replicated on every rank, each computing its one K/V head). How many "
                        "MiB of one layer's K/V projection weight does one tp rank hold, in "
                        "bf16? (In MiB; within 1%.)"),
        right=mib,
        wrong=[
            Wrong(lambda p: mib(p) / p["tp"],
                  "that splits the K/V projection over tp as if tp divided the K/V heads: "
                  "there are fewer K/V heads than ranks"),
            Wrong(lambda p: mib(p) / p["kv"],
                  "that is one K/V head's K and V, what a rank would keep if it held only the "
                  "head it reads; minitp keeps the whole projection and sums its gradient over tp"),
            Wrong(lambda p: mib(p) / 2,
                  "that counts K or V, not both"),
        ],
        worked=lambda p: (
            f"2 (K and V) × n_kv × d_head × d_model × 2 bytes = 2 × {p['kv']} × "
            f"{p['d'] // p['heads']} × {p['d']} × 2 = {mib(p):.1f} MiB on every rank "
            f"(`ReplicatedKV`); keeping only the head a rank reads would be {mib(p) / p['kv']:.1f} "
            "MiB, its gradient then summed over the ranks that share it."),
    )


def _local_to_global(p) -> int:
    """The global position of local token j on cp rank `rank` under the load-balanced
    split: chunks i and 2·cp−1−i of s / (2·cp) tokens, the early one first."""
    size, i = p["s"] // (2 * p["cp"]), p["rank"]
    chunk, offset = divmod(p["j"], size)
    return (i if chunk == 0 else 2 * p["cp"] - 1 - i) * size + offset


def _rope_mistakes(p) -> list[int]:
    """The usual mistakes' positions: local, the contiguous split, chunk i + cp."""
    size, i, k = p["s"] // (2 * p["cp"]), p["rank"], p["j"] - p["s"] // (2 * p["cp"])
    return [p["j"], i * (p["s"] // p["cp"]) + p["j"], (i + p["cp"]) * size + k]


def rope_positions(seed=None) -> Question:
    def draw(rng):
        while True:  # a token of the rank's second chunk, where every mistake differs
            cp = rng.choice((2, 4, 8))
            s = rng.choice((4096, 8192)) * cp
            p = {"cp": cp, "rank": rng.randrange(1, cp), "s": s,
                 "j": s // (2 * cp) + rng.randrange(s // (2 * cp))}
            values = [_local_to_global(p), *_rope_mistakes(p)]
            if len(set(values)) == len(values):
                order = list(range(4))
                rng.shuffle(order)  # where each kind of answer sits among (a)-(d)
                p["order"] = order
                return p

    def options(p):
        return [_local_to_global(p), *_rope_mistakes(p)]

    def letter(p, kind):
        return "abcd"[p["order"].index(kind)]

    return Question(
        key="09.rope-positions", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A sequence of s = {p['s']} tokens is split over cp = {p['cp']} ranks "
                        "by minitp's load-balanced split (lesson 08). cp rank "
                        f"{p['rank']} holds its {p['s'] // p['cp']} tokens in one local tensor, "
                        "in the order the split gives them. By which position must RoPE rotate "
                        f"the query and key of its local token j = {p['j']} (counted from 0)? "
                        + "; ".join(f"({'abcd'[k]}) {options(p)[p['order'][k]]}"
                                    for k in range(4)) + "."),
        right=lambda p: letter(p, 0),
        wrong=[
            Wrong(lambda p: letter(p, 1),
                  "that is the local position, the trap: every rank would rotate its tokens as "
                  "if they began the sequence, and q·k would see the wrong distances"),
            Wrong(lambda p: letter(p, 2),
                  "that is the contiguous split (rank i holding positions i·s/cp onward), which "
                  "gives the last rank most of the causal work; the load-balanced split gives "
                  "each rank an early and a late chunk"),
            Wrong(lambda p: letter(p, 3),
                  "that takes chunk i + cp for the late one: the balanced split pairs chunk i "
                  "with its mirror, chunk 2·cp−1−i, so that an early chunk and a late one share "
                  "a rank"),
        ],
        worked=lambda p: (
            f"({letter(p, 0)}) {_local_to_global(p)}. The split cuts s into 2·cp = "
            f"{2 * p['cp']} chunks of s/(2·cp) = {p['s'] // (2 * p['cp'])} and gives rank "
            f"{p['rank']} chunks {p['rank']} and 2·cp−1−{p['rank']} = "
            f"{2 * p['cp'] - 1 - p['rank']}, the early one first. Local token {p['j']} is past "
            f"the first chunk, so it is token {p['j'] - p['s'] // (2 * p['cp'])} of chunk "
            f"{2 * p['cp'] - 1 - p['rank']}: position {2 * p['cp'] - 1 - p['rank']}·"
            f"{p['s'] // (2 * p['cp'])} + {p['j'] - p['s'] // (2 * p['cp'])} = "
            f"{_local_to_global(p)} (`minitp.context_parallel.split.global_positions`, which "
            "`ContextParallelRotary` uses)."),
    )


QUESTIONS = {"09.ring-bytes": ring_bytes, "09.kv-weight": kv_weight,
             "09.rope-positions": rope_positions}
