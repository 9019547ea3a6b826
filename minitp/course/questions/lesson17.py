"""Lesson 17's questions: the first pipeline stage's activations under 1F1B, what to change
when a plan does not fit, and a published run's model TFLOP/s from its tokens per second."""

from __future__ import annotations

from dataclasses import replace

from ...calc.counts.flops import model_flops
from ...calc.footprint.memory import activation_bytes, activation_bytes_per_layer, memory_per_gpu
from ...calc.inference.serving import LLAMA3_8B, LLAMA3_70B
from ...calc.network.cluster import A100_80GB, GiB
from ...calc.planning.timing import step_time
from .form import Question, Wrong
from .models import gpt

MODELS = {"GPT-3 175B": gpt(12288, 96, 96), "a 39B GPT": gpt(8192, 64, 48),
          "a 13B GPT": gpt(5120, 40, 40)}


def first_stage_activations(seed=None) -> Question:
    def draw(rng):
        name = rng.choice(tuple(MODELS))
        pp = rng.choice(tuple(p for p in (4, 8, 16) if MODELS[name].n_layer % p == 0))
        return {"model": name, "tp": rng.choice((4, 8)), "pp": pp,
                "m": pp * rng.choice((2, 4))}

    def cfg(p):
        return MODELS[p["model"]]

    def per_layer(p):
        return activation_bytes_per_layer(cfg(p), 1, tp=p["tp"], sp=True)

    def right(p):
        return activation_bytes(cfg(p), 1, tp=p["tp"], sp=True, pp=p["pp"],
                                microbatches=p["m"]) / GiB

    def text(p):
        c = cfg(p)
        name = p["model"][0].upper() + p["model"][1:]
        return (f"{name} (l = {c.n_layer} layers, h = {c.d_model}, a = {c.n_head} heads, "
                f"s = {c.seq_len}) trains with t = {p['tp']} and sequence parallelism, "
                f"p = {p['pp']} pipeline stages, 1F1B, m = {p['m']} microbatches of one "
                "sequence, no recomputation. One layer keeps sbh/t·(34 + 5as/h) bytes of "
                "activations per microbatch (Korthikanti et al. 2022, Table 2). How many GiB "
                "of activations does a GPU of the first stage hold at its peak? (GiB, 2^30 "
                "bytes; within 1%.)")

    return Question(
        key="17.first-stage-activations", seed=seed, draw=draw, text=text, right=right,
        wrong=[
            Wrong(lambda p: per_layer(p) * cfg(p).n_layer / p["pp"] / GiB,
                  "that is one microbatch of the stage's l/p layers: under 1F1B the first stage "
                  "has p microbatches in flight before its first backward"),
            Wrong(lambda p: per_layer(p) * cfg(p).n_layer / p["pp"] * p["m"] / GiB,
                  "that keeps all m microbatches, as GPipe does; 1F1B starts a backward as soon "
                  "as it can, so at most p are in flight"),
            Wrong(lambda p: activation_bytes(cfg(p), 1, tp=p["tp"], sp=False, pp=p["pp"],
                                             microbatches=p["m"]) / GiB,
                  "that is without sequence parallelism, which leaves the LayerNorm and dropout "
                  "activations (10sbh) whole on every GPU; with it they are split by t too"),
            Wrong(lambda p: right(p) * GiB / 1e9,
                  "that is in GB (10^9 bytes); the question asks for GiB (2^30)"),
        ],
        worked=lambda p: (
            f"one layer, one microbatch: sbh/t·(34 + 5as/h) = {per_layer(p) / 2**20:,.1f} MiB; "
            f"a stage runs l/p = {cfg(p).n_layer // p['pp']} layers, and 1F1B keeps min(p, m) = "
            f"{p['pp']} microbatches in flight on the first stage: {p['pp']}·"
            f"{cfg(p).n_layer // p['pp']} = {cfg(p).n_layer} layers' worth, whatever p is: "
            f"{right(p):.2f} GiB (`calc.activation_bytes`, a MODEL that lesson 05 measured to "
            "the byte at small scale). A deeper pipeline divides the model states, not these."),
    )


def make_it_fit(seed=None) -> Question:
    GPT3 = MODELS["GPT-3 175B"]

    def draw(rng):
        return {"n": rng.choice((256, 512, 1024)), "batch": rng.choice((768, 1536))}

    def options(p):  # name: (dp, pp, recompute, global batch)
        d = p["n"] // 64
        return {"now": (d, 8, None, p["batch"]), "a": (d, 8, "full", p["batch"]),
                "b": (d, 8, "selective", p["batch"]), "c": (d // 2, 16, None, p["batch"]),
                "d": (d, 8, None, p["batch"] // 2)}

    def judged(p):
        out = {}
        for key, (dp, pp, recompute, batch) in options(p).items():
            m = batch // dp
            memory = memory_per_gpu(GPT3, 1, dp, pp, 8, True, recompute, optimizer="megatron",
                                    microbatches=m)["total"]
            seconds = step_time(GPT3, A100_80GB, dp, pp, 8, 1, batch, True, recompute).total
            out[key] = (memory / GiB, seconds)
        return out

    def text(p):
        now = judged(p)["now"]
        d = p["n"] // 64
        return (f"GPT-3 175B on {p['n']} A100 80GB GPUs (NVIDIA's A100 datasheet: 312 TFLOP/s "
                "dense bf16; `calc.A100_80GB` counts its 80 GB as 80 GiB), global batch "
                f"{p['batch']}, (d, p, t) = ({d}, 8, 8), "
                "sequence parallelism, 1F1B, micro-batch 1, 18 bytes per parameter: the busiest "
                f"GPU needs {now[0]:.1f} GiB, over the 72 GiB usable (90%). Which change makes it "
                "fit at the smallest cost in step time (`calc.step_time`, a MODEL)? Answer 'a', "
                "'b', 'c' or 'd': (a) full recomputation; (b) selective recomputation; (c) "
                f"p = 16 and d = {d // 2}; (d) halve the global batch.")

    return Question(
        key="17.make-it-fit", seed=seed, draw=draw, kind="choice", text=text,
        right=lambda p: "c",
        wrong=[
            Wrong(lambda p: "a", "it fits, but it runs every layer's forward twice: a third "
                                 "more compute, the slowest of the ones that fit"),
            Wrong(lambda p: "b", "it fits, at a few percent more compute; twice the stages "
                                 "fit without recomputing anything, and that is faster here"),
            Wrong(lambda p: "d", "1F1B keeps min(p, m) microbatches in flight: with m still at "
                                 "least p, the activations do not shrink, and nothing else does"),
        ],
        worked=lambda p: (
            "under 1F1B the first stage holds l layers' worth of activations whatever p is, so "
            "p divides only the model states: p = 16 halves them. The busiest GPU and the step, "
            "by `calc.memory_per_gpu` and `calc.step_time` (MODELS): " + "; ".join(
                f"({k}) {gib:.1f} GiB, {sec:.2f} s" for k, (gib, sec) in judged(p).items()
                if k != "now")
            + ". (d) still does not fit (its shorter step does half the work). Of the three "
            "that fit under 72 GiB, (c) is the fastest: no recomputation, and a bubble (p-1)/m "
            "that is still small."),
    )


def identity_tflops(seed=None) -> Question:
    shapes = {"Llama 3 8B": LLAMA3_8B, "Llama 3 70B": LLAMA3_70B}

    def draw(rng):
        return {"model": rng.choice(tuple(shapes)), "s": rng.choice((4096, 8192)),
                "tokens": rng.choice((1200, 1600, 2500, 4000, 9000, 14000))}

    def flops(p, causal=True):  # per token
        cfg = replace(shapes[p["model"]], seq_len=p["s"])
        return model_flops(cfg, 1, causal=causal) / p["s"]

    def tflops(p, per_token):
        return p["tokens"] * per_token / 1e12

    def head(p):
        c = shapes[p["model"]]
        return 6 * c.vocab_size * c.d_model

    def text(p):
        c = shapes[p["model"]]
        kv = c.n_kv_head * c.d_model // c.n_head
        return (f"A run of {p['model']} (l = {c.n_layer} layers, h = {c.d_model}, K/V "
                f"projections {kv} wide, a SwiGLU MLP {c.ffn_hidden} wide, vocabulary "
                f"{c.vocab_size:,}, no biases) at sequence length s = {p['s']} prints "
                f"{p['tokens']:,} tokens/s per GPU. Its model TFLOP/s per GPU is Megatron-LM's "
                "count: per token, 6 FLOPs per weight a token multiplies (q, k, v, o, the MLP's "
                "three matrices, the output head; the embedding's lookup none) plus 6·s·h per "
                "layer for attention's QKᵀ and ·V, causal. What TFLOP/s per GPU does it "
                "report? (Within 1%.)")

    return Question(
        key="17.identity-tflops", seed=seed, draw=draw, text=text,
        right=lambda p: tflops(p, flops(p)),
        wrong=[
            Wrong(lambda p: tflops(p, flops(p, causal=False)),
                  "that counts full attention, 12·s·h a layer (minitp's default, Korthikanti "
                  "et al. Eq. 7); Megatron-LM's causal count is half of it"),
            Wrong(lambda p: tflops(p, flops(p) - head(p)),
                  "the output head is a matmul every token runs: its 6·V·h counts"),
            Wrong(lambda p: tflops(p, flops(p)) * 1e3,
                  "that is in GFLOP/s: the question asks for TFLOP/s (10^12)"),
        ],
        worked=lambda p: (
            f"FLOPs per token: 6 × the weights a token multiplies + 6·s·h·l = "
            f"{flops(p) / 1e9:.2f} GFLOP (`calc.model_flops(cfg, 1, causal=True) / s`); "
            f"× {p['tokens']:,} tokens/s = {tflops(p, flops(p)):.1f} TFLOP/s. Full attention "
            f"would say {tflops(p, flops(p, causal=False)):.1f}: the same run, "
            f"{flops(p, causal=False) / flops(p) - 1:.1%} apart by convention alone. "
            "Arithmetic on a printed number, not a MODEL of the run."),
    )


QUESTIONS = {"17.first-stage-activations": first_stage_activations,
             "17.make-it-fit": make_it_fit, "17.identity-tflops": identity_tflops}
