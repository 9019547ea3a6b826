"""Lesson 03's questions: a tensor-parallel layer's bytes, and how to split a GPT-2 style
qkv projection by heads."""

from __future__ import annotations

from types import SimpleNamespace

from ...calc.network.comm import ring_wire_bytes, tp_comm_bytes
from .form import Question, Wrong

BF16 = 2  # bytes a value


def layer_bytes(seed=None) -> Question:
    def draw(rng):
        return {"b": rng.choice((1, 2)), "s": rng.choice((2048, 4096)),
                "h": rng.choice((4096, 5120, 6144, 8192)), "t": rng.choice((4, 8))}

    def activation(p):
        return p["b"] * p["s"] * p["h"] * BF16

    def right(p):
        cfg = SimpleNamespace(seq_len=p["s"], d_model=p["h"])
        return tp_comm_bytes(cfg, p["b"], p["t"], bytes_per_value=BF16)

    return Question(
        key="03.layer-bytes", seed=seed, draw=draw,
        text=lambda p: (f"One transformer layer runs tensor-parallel over t = {p['t']} ranks, "
                        f"as in this lesson, on a micro-batch of b = {p['b']} sequences of "
                        f"s = {p['s']:,} tokens, hidden size h = {p['h']:,}, activations in "
                        "bf16 (2 bytes a value). In the ring model, how many bytes does each "
                        "rank send for this layer, forward and backward together? (A number "
                        "of bytes; within 1%.)"),
        right=right,
        wrong=[
            Wrong(lambda p: right(p) / 2,
                  "that is the forward pass only: backward, the two f's all-reduce as much "
                  "again"),
            Wrong(lambda p: 4 * activation(p),
                  "that counts each all-reduce as sending its tensor once: a ring all-reduce "
                  "sends 2(t-1)/t of it per rank"),
            Wrong(lambda p: right(p) / p["t"],
                  "that divides by t: each all-reduce carries the whole (b, s, h) activation, "
                  "so the bytes per rank do not shrink as t grows"),
            Wrong(lambda p: 2 * right(p), "that prices the activations in float32: they are "
                                          "bf16 here, 2 bytes a value"),
        ],
        worked=lambda p: (
            "2 all-reduces forward (the g after attention and after the MLP) and 2 backward "
            f"(their f's), each of a (b, s, h) activation: {p['b']}·{p['s']:,}·{p['h']:,}·2 B = "
            f"{activation(p):,} bytes. A ring all-reduce sends 2(t-1)/t of it per rank: "
            f"{ring_wire_bytes('all_reduce', activation(p), p['t']):,.0f} bytes. Four of them: "
            f"{right(p):,.0f} bytes, the 8bsh(t-1)/t values of Narayanan et al. 2021 §3.3 "
            "(`minitp.calc.tp_comm_bytes`), a MODEL: a real run also sends the communication "
            "library's message headers."),
    )


def qkv_order(seed=None) -> Question:
    def draw(rng):
        return {"n_head": rng.choice((12, 16, 32)), "t": rng.choice((2, 4))}

    return Question(
        key="03.qkv-order", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A checkpoint's attention has n = {p['n_head']} heads and one qkv "
                        "projection nn.Linear(h, 3h) whose output features are ordered "
                        "(q/k/v, head, head_dim), as GPT-2's c_attn: all queries, then all "
                        f"keys, then all values. You split it over t = {p['t']} ranks so "
                        "that each rank stores 1/t of qkv and runs attention for its own heads "
                        "with no communication. What must you do? Answer 'a', 'b', 'c' or "
                        "'d': (a) nothing: `ColumnParallelLinear.from_dense` (contiguous "
                        "blocks of output features) already splits by heads; (b) reorder the "
                        "3h output features (the weight's rows and the bias) to (head, q/k/v, "
                        "head_dim), then split them in contiguous blocks; (c) split qkv by its "
                        "input features (a row split) instead; (d) split by contiguous blocks, "
                        "then all-gather the qkv output on every rank."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "in that order a contiguous block is not a set of heads: "
                                 "rank 0 would hold queries and no values (the lesson printed "
                                 "it for 4 heads on 2 ranks)"),
            Wrong(lambda p: "c", "a row split gives partial sums of every head's q, k and v: "
                                 "an all-reduce before attention could start"),
            Wrong(lambda p: "d", "that gives every rank the right q, k and v, at the price of "
                                 "an all-gather in every layer: the reorder costs nothing"),
        ],
        worked=lambda p: (
            f"with the features in (head, q/k/v, head_dim) order, rank r's contiguous block of "
            f"3h/t features is exactly the q, k and v of heads r·n/t to (r+1)·n/t - 1: "
            f"{p['n_head'] // p['t']} whole heads of {p['n_head']} per rank. Reordering a "
            "weight's rows (and the bias) once, when you load the checkpoint, is free at run "
            "time; minitp's model and Megatron-LM store qkv in that order from the start."),
    )


QUESTIONS = {"03.layer-bytes": layer_bytes, "03.qkv-order": qkv_order}
