"""Lesson 05's questions: a layer's activation bytes with sequence parallelism, the bytes
its collectives send, and which gradients must be summed over the tensor-parallel group."""

from __future__ import annotations

from types import SimpleNamespace

from ...calc.footprint.memory import activation_bytes_per_layer
from ...rules import ring_wire_bytes
from .form import Question, Wrong

# (hidden size h, attention heads a) of three published models: GPT-3 6.7B and 175B (Brown
# et al. 2020, Table 2.1) and the 22B model of Korthikanti et al. 2022 (Table 3).
MODELS = {"GPT-3 6.7B": (4096, 32), "the 22B model": (6144, 64), "GPT-3 175B": (12288, 96)}
SOURCES = {"GPT-3 6.7B": "Brown et al. 2020, Table 2.1", "GPT-3 175B": "Brown et al. 2020, "
           "Table 2.1", "the 22B model": "Korthikanti et al. 2022, Table 3"}


def _shape(p):
    h, a = MODELS[p["model"]]
    return SimpleNamespace(seq_len=p["s"], d_model=h, n_head=a)


def sp_memory(seed=None) -> Question:
    def draw(rng):
        return {"model": rng.choice(tuple(MODELS)), "s": rng.choice((2048, 4096)),
                "b": rng.choice((1, 2, 4)), "t": rng.choice((2, 4, 8))}

    def sbh(p):
        return p["s"] * p["b"] * MODELS[p["model"]][0]

    def attention(p):  # 5as/h, the attention core's share
        h, a = MODELS[p["model"]]
        return 5 * a * p["s"] / h

    def bytes_(p, sp=True, recompute=None):
        return activation_bytes_per_layer(_shape(p), p["b"], tp=p["t"], sp=sp,
                                          recompute=recompute)

    return Question(
        key="05.sp-memory", seed=seed, draw=draw,
        text=lambda p: (f"One transformer layer of {p['model']} (h = {MODELS[p['model']][0]}, "
                        f"a = {MODELS[p['model']][1]} heads: {SOURCES[p['model']]}) runs with "
                        f"tensor parallelism and sequence parallelism at t = {p['t']}, sequence "
                        f"length s = {p['s']}, micro-batch b = {p['b']}, no recomputation. How "
                        "many bytes of activations does it keep for backward on one rank, by "
                        "Korthikanti et al.'s Table 2 (16-bit activations, 1-byte dropout "
                        "masks)? (A number of bytes; within 1%.)"),
        right=bytes_,
        wrong=[
            Wrong(lambda p: bytes_(p, sp=False),
                  "that is tensor parallelism alone, sbh(10 + 24/t + 5as/ht): sequence "
                  "parallelism also splits the 10sbh of LayerNorm inputs, the inputs of qkv "
                  "and fc, and the dropout masks"),
            Wrong(lambda p: sbh(p) * (34 + attention(p)),
                  "that is the layer on one device, sbh(34 + 5as/h): with tensor and sequence "
                  "parallelism every term is divided by t"),
            Wrong(lambda p: bytes_(p, recompute="selective"),
                  "that is 34sbh/t, which leaves out the attention core's 5as²b/t (softmax "
                  "output, its dropout mask and output): only selective recomputation drops it"),
        ],
        worked=lambda p: (
            f"sbh = {p['s']}·{p['b']}·{MODELS[p['model']][0]} = {sbh(p):,}; 5as/h = "
            f"5·{MODELS[p['model']][1]}·{p['s']}/{MODELS[p['model']][0]} = {attention(p):.2f}. "
            f"With sequence parallelism everything is split by t: sbh/t·(34 + 5as/h) = "
            f"{sbh(p):,}/{p['t']}·{34 + attention(p):.2f} = {bytes_(p):,.0f} bytes "
            "(`minitp.calc.activation_bytes_per_layer`, Table 2; a MODEL: the ledger of this "
            f"lesson finds a few named extras beyond it). Tensor parallelism alone would keep "
            f"{bytes_(p, sp=False):,.0f}."),
    )


def sp_bytes(seed=None) -> Question:
    def draw(rng):
        return {"s": rng.choice((1024, 2048, 4096)), "b": rng.choice((1, 2, 4)),
                "h": rng.choice((4096, 6144, 12288)), "t": rng.choice((4, 8, 16))}

    def size(p):  # one activation, bf16
        return 2 * p["b"] * p["s"] * p["h"]

    def per_layer(p, reduce_scatter="reduce_scatter", passes=2):
        pair = (ring_wire_bytes("all_gather", size(p), p["t"])
                + ring_wire_bytes(reduce_scatter, size(p), p["t"]))
        return passes * 2 * pair

    return Question(
        key="05.sp-bytes", seed=seed, draw=draw,
        text=lambda p: (f"One transformer layer with tensor and sequence parallelism at t = "
                        f"{p['t']}; each activation is b·s·h = {p['b']}·{p['s']}·{p['h']} values "
                        "in bf16 (2 bytes). How many bytes does one rank send for the layer's "
                        "all-gathers and reduce-scatters, forward and backward together, in the "
                        "ring model (what NCCL sends)? (A number of bytes; within 1%.)"),
        right=per_layer,
        wrong=[
            Wrong(lambda p: per_layer(p, reduce_scatter="all_reduce"),
                  "that is what gloo sends: its reduce-scatter moves an all-reduce's bytes, "
                  "twice the ring's (measured in this lesson); the ring model sends less"),
            Wrong(lambda p: per_layer(p, passes=1),
                  "that is one pass only: backward runs the same 2 all-gathers and 2 "
                  "reduce-scatters, each the adjoint of a forward one"),
            Wrong(lambda p: 8 * size(p),
                  "that sends the whole activation in each of the 8 collectives: in a ring "
                  "each rank sends (t-1)/t of it, its own chunk stays home"),
            Wrong(lambda p: 8 * ring_wire_bytes("all_reduce", size(p), p["t"]),
                  "that prices each of the 8 collectives as an all-reduce, 2(t-1)/t·S: an "
                  "all-gather or a reduce-scatter is half of one, (t-1)/t·S"),
        ],
        worked=lambda p: (
            f"S = 2·{p['b']}·{p['s']}·{p['h']} = {size(p):,} bytes. Per pass the layer runs 2 "
            "all-gathers (before qkv and fc) and 2 reduce-scatters (after the two proj "
            "layers), each "
            f"(t-1)/t·S = {ring_wire_bytes('all_gather', size(p), p['t']):,.0f}; forward and "
            f"backward: 8·(t-1)/t·S = {per_layer(p):,.0f} bytes, a MODEL (the ring's). It is "
            "exactly what tensor parallelism's 4 all-reduces send, 4·2(t-1)/t·S: sequence "
            "parallelism costs no extra bytes on a ring."),
    )


def partial_grads(seed=None) -> Question:
    def draw(rng):
        return {"t": rng.choice((2, 4, 8))}

    return Question(
        key="05.partial-grads", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A GPT runs with tensor and sequence parallelism at t = {p['t']}, and "
                        "you write its training step yourself: forward, backward, optimizer "
                        "step. Which gradient must you sum over the tensor-parallel group before "
                        "the optimizer step, or the replicas drift apart? Answer 'a', 'b', 'c' "
                        "or 'd': (a) the qkv layer's weight shard (column-parallel); (b) the "
                        "LayerNorm weight γ; (c) the MLP's proj weight shard (row-parallel); "
                        "(d) none: the reduce-scatters have summed everything already."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "a column-parallel shard is this rank's alone, and its "
                                 "gradient is complete on this rank: it meets the all-gathered "
                                 "input of every position"),
            Wrong(lambda p: "c", "a row-parallel shard is this rank's alone, and its gradient "
                                 "is complete: the output gradient it meets was all-gathered "
                                 "over every position"),
            Wrong(lambda p: "d", "the reduce-scatters sum activations, not parameter "
                                 "gradients: each rank's γ gradient covers only its own "
                                 "positions (Megatron-LM issue #1446)"),
        ],
        worked=lambda p: (
            "γ is replicated, but under sequence parallelism each rank runs the LayerNorm on "
            f"its own s/{p['t']} positions, so its backward gives the sum over those positions "
            "only: a partial gradient. The full gradient is the sum over the ranks: one "
            "all-reduce (`model.sync_partial_grads()`, which `mt.train_step` calls). The same "
            "holds for every LayerNorm's γ and β, the row-parallel biases and the position "
            "embedding; the sharded weights' gradients are whole already."),
    )


QUESTIONS = {"05.sp-memory": sp_memory, "05.sp-bytes": sp_bytes,
             "05.partial-grads": partial_grads}
