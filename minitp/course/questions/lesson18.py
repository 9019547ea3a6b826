"""Lesson 18's questions: the KV cache bytes one token adds on one GPU of a tensor-parallel
Llama 3, the batch at which decoding's weight matmuls turn compute-bound (weights stored in
int8 or int4: the lesson prints bf16's), and what doubling tp does to the modelled time per
decode step under a ring or a one-shot all-reduce (at batches the lesson does not print)."""

from __future__ import annotations

from ...calc import A100_80GB, H100_80GB
from ...calc.inference.serving import (
    LLAMA3_8B,
    LLAMA3_70B,
    critical_batch,
    decode_step_time,
    kv_cache_bytes_per_token,
)
from .form import Question, Wrong

MODELS = {"Llama 3 8B": LLAMA3_8B, "Llama 3 70B": LLAMA3_70B}  # Dubey et al. 2024, Table 3
CLUSTERS = {"A100 80GB": A100_80GB, "H100 80GB": H100_80GB}
WIDTHS = {2: "bf16", 1: "int8"}
STORED = {1: "int8 (1 byte a weight)", 0.5: "int4 (half a byte a weight)"}  # W8A16, W4A16
ALLREDUCES = {"ring": "a ring all-reduce: 2(t−1) hops",
              "one_shot": "vLLM's one-shot all-reduce: one hop, every peer's buffer read"}


def kv_bytes(seed=None) -> Question:
    def draw(rng):
        return {"name": rng.choice(sorted(MODELS)), "tp": rng.choice((2, 4, 8, 16)),
                "w": rng.choice((2, 1))}

    def kib(p, tp=None, halves=1):
        shape, tp = MODELS[p["name"]], p["tp"] if tp is None else tp
        return kv_cache_bytes_per_token(shape, p["w"], tp) / halves / 1024

    def text(p):
        m = MODELS[p["name"]]
        return (f"{p['name']} ({m.n_layer} layers, {m.n_head} query heads and {m.n_kv_head} "
                f"K/V heads of {m.head_dim}) is served with tensor parallelism t = {p['tp']}, "
                f"its KV cache in {WIDTHS[p['w']]}. How many KiB of cache does one more token "
                "of one sequence add on one GPU? (KiB; within 1%.)")

    def worked(p):
        m = MODELS[p["name"]]
        kept = m.n_kv_head // p["tp"] if m.n_kv_head % p["tp"] == 0 else 1
        how = ("t divides them" if m.n_kv_head % p["tp"] == 0 else
               f"t is above them, so each GPU keeps the one its query heads read, copied on "
               f"{p['tp'] // m.n_kv_head} GPUs")
        return (f"a GPU keeps the cache of its own K/V heads: {kept} of {m.n_kv_head} ({how}). "
                f"A token adds a K and a V for each, in every layer: 2 · {m.n_layer} · {kept} "
                f"· {m.head_dim} · {p['w']} bytes = {kib(p):,.1f} KiB "
                "(`mt.calc.kv_cache_bytes_per_token`). With one K/V head per query head (MHA) "
                f"it would be {m.n_head // m.n_kv_head}x as much: that is what grouped-query "
                "attention saves.")

    return Question(
        key="18.kv-bytes", seed=seed, draw=draw, text=text, right=kib, worked=worked,
        wrong=[
            Wrong(lambda p: kib(p, halves=2), "that is K alone: the cache keeps V as well"),
            Wrong(lambda p: kib(p, tp=1), "that is the whole cache: a GPU keeps only the K/V "
                                          "heads its query heads read"),
        ])


def turn_compute_bound(seed=None) -> Question:
    def draw(rng):
        return {"gpu": rng.choice(sorted(CLUSTERS)), "w": rng.choice((1, 0.5)),
                "tp": rng.choice((4, 8))}

    def right(p):
        return critical_batch(CLUSTERS[p["gpu"]], p["w"])

    def text(p):
        c = CLUSTERS[p["gpu"]]
        return (f"A dense model decodes on {p['gpu']} GPUs ({c.peak_flops / 1e12:,.0f} TFLOP/s "
                f"of bf16, {c.memory_bandwidth / 1e9:,.0f} GB/s of HBM), split over tp = "
                f"{p['tp']}, its weights stored in {STORED[p['w']]} and multiplied in bf16. "
                "Leaving the KV cache aside, above what batch (sequences decoding together) "
                "does a step take longer computing with its weights than reading them? "
                "(Within 1%.)")

    def worked(p):
        c = CLUSTERS[p["gpu"]]
        size = f"{p['w']:g} byte"
        return (f"a step reads each of a GPU's N/t weights once ({size}) and does 2 "
                f"FLOPs with it per sequence: 2B·(N/t)/peak ≥ (N/t)·{p['w']}/bandwidth when B ≥ "
                f"peak/bandwidth · {p['w']}/2 = {c.balance_point:,.0f} · {p['w']}/2 = "
                f"{right(p):,.0f} (a MODEL: peaks, `mt.calc.critical_batch`; the Scaling "
                "Book's B_crit). tp cancels: each GPU reads and computes 1/t of it. Fewer "
                f"bytes a weight lower it: bf16's is {c.balance_point:,.0f}. Below this batch "
                "decoding waits on memory, so a bigger batch is nearly free.")

    return Question(
        key="18.compute-bound", seed=seed, draw=draw, text=text, right=right, worked=worked,
        wrong=[
            Wrong(lambda p: 2 * right(p), "that counts one FLOP per weight, or twice a "
                                          "weight's bytes: a multiply and an add are 2 FLOPs "
                                          "per weight per sequence, and a weight stored in "
                                          "int8 is read as 1 byte (at int8 this is bf16's "
                                          "batch, the lesson's)"),
            Wrong(lambda p: right(p) * p["tp"], "tp divides the FLOPs and the bytes alike: "
                                                "it cancels"),
            Wrong(lambda p: right(p) / p["tp"], "tp divides the FLOPs and the bytes alike: "
                                                "it cancels"),
        ])


def tp_buys(seed=None) -> Question:
    def draw(rng):
        # not batch 8: the lesson prints its steps at every tp
        return {"name": rng.choice(sorted(MODELS)), "batch": rng.choice((1, 16, 32)),
                "tp": rng.choice((1, 2, 4)), "context": 4096,
                "allreduce": rng.choice(sorted(ALLREDUCES))}

    def steps(p):
        shape = MODELS[p["name"]]
        return [decode_step_time(shape, H100_80GB, p["batch"], p["context"], t,
                                 allreduce=p["allreduce"]) for t in (p["tp"], 2 * p["tp"])]

    def right(p):
        before, after = steps(p)
        if after.seconds <= before.seconds / 2:
            return "a"
        return "b" if after.seconds < before.seconds else "c"

    def text(p):
        return (f"{p['name']} decodes {p['batch']} sequence(s) with {p['context']:,} cached "
                f"positions each on DGX H100 GPUs of one node, in bf16. By minitp's model "
                f"(`mt.calc.decode_step_time`: the reads at HBM bandwidth, two all-reduces a "
                f"layer of B·h values, each {ALLREDUCES[p['allreduce']]}, at the cluster's "
                "assumed 5 µs a hop and 450 GB/s of NVLink), what does going from tp = "
                f"{p['tp']} to tp = {2 * p['tp']} do to the time per step? Answer 'a', 'b' or "
                "'c': (a) it halves, or better; (b) it shortens, by less than half; (c) it "
                "grows, or stays the same.")

    def worked(p):
        before, after = steps(p)
        parts = " → ".join(f"tp {s.tp}: reads {1e3 * (s.cache_seconds + s.weight_seconds):.2f} "
                           f"ms + all-reduces {1e3 * s.comm_seconds:.2f} ms"
                           for s in (before, after))
        grows = ("2(t−1) hops of latency on a ring, growing with t" if p["allreduce"] == "ring"
                 else "one hop whatever t, plus (t−1)·B·h·w bytes read from the peers")
        return (f"{parts} (a MODEL). The reads halve; the all-reduces do not: 2 per layer, "
                f"each {grows}. So tp can never halve the step, and it stops paying where the "
                f"all-reduces outgrow the reads it saves. Here: ({right(p)}).")

    return Question(
        key="18.tp-buys", seed=seed, draw=draw, kind="choice", text=text, right=right,
        worked=worked,
        wrong=[
            Wrong(lambda p: "a", "halving needs the all-reduces to be free: tp halves the "
                                 "reads, but adds its all-reduces' latency"),
            Wrong(lambda p: "c" if right(p) == "b" else "b",
                  "work both terms out at each tp: the reads fall as 1/t; a ring's hops grow "
                  "as 2(t−1), a one-shot's stay one; 2 all-reduces per layer"),
        ])


QUESTIONS = {"18.kv-bytes": kv_bytes, "18.compute-bound": turn_compute_bound,
             "18.tp-buys": tp_buys}
