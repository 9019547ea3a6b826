"""Lesson 08's questions: the bytes ring attention sends, the cost of a contiguous causal
split, and which axis to add when a long sequence does not fit."""

from __future__ import annotations

from ...calc.network.comm import cp_comm_bytes
from ...model import GPTConfig
from ...rules import cp_chunks
from .form import Question, Wrong


def _config(p) -> GPTConfig:
    return GPTConfig(vocab_size=32000, seq_len=p["s"], n_layer=1, n_head=p["h"] // 128,
                     d_model=p["h"])


def ring_bytes(seed=None) -> Question:
    def draw(rng):
        # c >= 4 keeps every usual mistake apart from the others and from the answer
        return {"s": rng.choice((32768, 65536, 131072)), "h": rng.choice((4096, 8192)),
                "c": rng.choice((4, 8)), "t": rng.choice((2, 4, 8))}

    def message(p):  # one rank's K or V, its heads only: b·(s/c)·h/t values, 2 bytes each
        return 2 * p["s"] * p["h"] / (p["c"] * p["t"])

    return Question(
        key="08.ring-bytes", seed=seed, draw=draw,
        text=lambda p: (f"A layer of hidden size h = {p['h']} runs ring attention over "
                        f"c = {p['c']} context-parallel ranks on a sequence of s = {p['s']:,} "
                        f"tokens (micro-batch 1), each rank also tensor-parallel over "
                        f"t = {p['t']} (its K and V hold its own heads only), K and V in "
                        "bfloat16. How many bytes does one GPU send for context parallelism "
                        "in this layer, forward and backward together, with minitp's ring? "
                        "(A number of bytes; within 1%.)"),
        right=lambda p: cp_comm_bytes(_config(p), 1, p["c"], p["t"]),
        wrong=[
            Wrong(lambda p: 2 * (p["c"] - 1) * message(p),
                  "that is the forward pass alone: backward sends K and V round again, and "
                  "the dK/dV accumulators c hops more"),
            Wrong(lambda p: 4 * (p["c"] - 1) * message(p),
                  "that counts K and V forward and backward but leaves out the dK/dV "
                  "accumulators, which travel with the blocks and take one last hop home"),
            Wrong(lambda p: (3 * p["c"] - 2) * message(p),
                  "that sends K only: every hop carries V too, a message of the same size"),
            Wrong(lambda p: 2 * (3 * p["c"] - 2) * message(p) * p["c"],
                  "each message is one rank's block, s/c positions, not the whole sequence's "
                  "K or V"),
        ],
        worked=lambda p: (
            f"one message is one rank's K or V: (s/c)·h/t = {p['s'] // p['c']:,}·{p['h']}/"
            f"{p['t']} values of 2 bytes = {message(p):,.0f} bytes. Forward: K and V c-1 hops, "
            f"2(c-1) = {2 * (p['c'] - 1)} messages; backward: K and V again, "
            f"{2 * (p['c'] - 1)}, and dK/dV c hops (the last one home), {2 * p['c']}: "
            f"2(3c-2) = {2 * (3 * p['c'] - 2)} messages, "
            f"{cp_comm_bytes(_config(p), 1, p['c'], p['t']):,.0f} bytes per layer "
            "(`minitp.calc.cp_comm_bytes`, a MODEL; the lesson's trace counted the same 2(3c-2) "
            "messages, 20 at c = 4)."),
    )


def causal_split(seed=None) -> Question:
    def draw(rng):
        return {"c": rng.choice((2, 4, 8, 16))}

    def blocks(rank, c, chunks):
        # (query chunk, key chunk) blocks the causal mask keeps: a key chunk at or before
        # the query chunk; a diagonal one is computed as a masked square, a whole block
        return sum(q + 1 for q in chunks(rank, c))

    def contiguous(rank, c):
        return 2 * rank, 2 * rank + 1

    def ratio(p, half_diagonal=False):
        c = p["c"]
        cut = 2 if half_diagonal else 0  # two diagonal blocks per rank, either split
        slow = max(blocks(r, c, contiguous) for r in range(c)) - cut / 2
        even = blocks(0, c, cp_chunks) - cut / 2
        return slow / even

    return Question(
        key="08.causal-split", seed=seed, draw=draw,
        text=lambda p: (f"Causal attention runs on a ring of c = {p['c']} ranks, the sequence "
                        f"cut into 2c = {2 * p['c']} equal chunks. Contiguous, rank r holds "
                        "chunks 2r and 2r+1; load-balanced, chunks r and 2c-1-r. Every rank "
                        "computes a (query chunk, key chunk) block at the same rate, a block "
                        "on the diagonal as a masked square (as long as a full one), and the "
                        "ring runs at the pace of its slowest rank. How many times as long "
                        "does the attention take with the contiguous split as with the "
                        "load-balanced one? (A ratio; within 1%.)"),
        right=ratio,
        wrong=[
            Wrong(lambda p: 1.0, "both splits compute the same blocks in total, but the ring "
                                 "waits for its slowest rank, and contiguous chunks give the "
                                 "last rank the most"),
            Wrong(lambda p: (4 * p["c"] - 1) / 3,
                  "that is the last rank's work over the first's: the balanced split does not "
                  "run at the pace of the contiguous split's fastest rank, but at the mean"),
            Wrong(lambda p: ratio(p, half_diagonal=True),
                  "that counts a diagonal block as half a block; the ring computes it as a "
                  "masked square, a whole block's time"),
        ],
        worked=lambda p: (
            f"rank r's query chunk q sees the key chunks 0..q: q+1 blocks. Contiguous, rank r "
            f"computes (2r+1) + (2r+2) = 4r+3 blocks, the last rank 4c-1 = {4 * p['c'] - 1}. "
            f"Balanced, every rank computes (r+1) + (2c-r) = 2c+1 = {2 * p['c'] + 1}, the mean "
            f"of the contiguous split too. (4c-1)/(2c+1) = {ratio(p):.3f}: counted work, a "
            "MODEL of time (the lesson counted 15 against 9 at c = 4)."),
    )


def which_axis(seed=None) -> Question:
    def draw(rng):
        return {"s": rng.choice((262144, 524288, 1048576))}

    return Question(
        key="08.which-axis", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A model with 8 key/value heads (grouped-query attention) trains on "
                        f"sequences of s = {p['s']:,} tokens on nodes of 8 GPUs (a DGX node; "
                        "NVLink inside it, slower links between nodes). With t = 8 tensor "
                        "parallelism, sequence parallelism and selective recomputation, "
                        "micro-batches of one sequence, one layer's activations on a GPU still "
                        "do not fit. Which change halves them? "
                        "Answer 'a', 'b', 'c' or 'd': (a) t = 16, across two nodes; (b) "
                        "context parallelism c = 2; (c) a fused attention kernel (flash "
                        "attention) in place of the written-out core; (d) twice as many "
                        "data-parallel ranks."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "attention is split by heads: t = 16 exceeds the 8 key/value "
                                 "heads (K and V would be copied), and tensor parallelism's "
                                 "collectives in every layer would cross the slow links"),
            Wrong(lambda p: "c", "a fused kernel never writes the s x s scores, but selective "
                                 "recomputation already keeps none of them; what is left is "
                                 "linear in s and divided by t alone, and a fused kernel does "
                                 "not divide it"),
            Wrong(lambda p: "d", "data parallelism splits the batch, not a sequence: each "
                                 "rank still runs whole sequences of s tokens"),
        ],
        worked=lambda p: (
            "with no s x s tensor kept, what is left is linear in s and divided by t, and t is "
            "capped: by the 8 K/V heads and by the node. Context parallelism splits the "
            f"sequence inside attention too: each of c ranks keeps s/c = {p['s'] // 2:,} "
            "positions of every activation, Q, K, V and the output included, and K/V travel "
            "round the ring, so activations per rank fall as 1/c (measured in this lesson: "
            "SP + CP at c = 2 kept about half of SP + selective). It adds 2(3c-2) messages of "
            "K or V per layer, overlapped with compute."),
    )


QUESTIONS = {"08.ring-bytes": ring_bytes, "08.causal-split": causal_split,
             "08.which-axis": which_axis}
