"""Lesson 19's questions: the bytes one serving GPU receives in a refit of a Llama 3 model
from (dp 2, pp, tp 8) onto tp-8 serving nodes, collocated or separate (`mt.calc.refit_cost`,
a MODEL: the lesson prints Llama 3 70B at pp 4), and what stays bit for bit equal between
trainer and generator (the weights; the bf16 log-probabilities only at the same tp with
batch-invariant kernels: torchtitan's `experiments/rl/docs/bitwise_parity.md`)."""

from __future__ import annotations

from ...calc import H100_80GB
from ...calc.inference.serving import LLAMA3_8B, LLAMA3_70B
from ...calc.network.refit_cost import refit_cost
from .form import Question, Wrong

GB = 10**9
MODELS = {"Llama 3 8B": LLAMA3_8B, "Llama 3 70B": LLAMA3_70B}  # Dubey et al. 2024, Table 3
SERVING = {"collocated": "on the training nodes themselves (collocated: each of them a "
                         "serving replica)",
           "separate": "on 2 serving nodes of their own (separate)"}


def refit_bytes(seed=None) -> Question:
    def draw(rng):
        name, pp, serving = (rng.choice(sorted(MODELS)), rng.choice((4, 8)),
                             rng.choice(sorted(SERVING)))
        if (name, pp) == ("Llama 3 70B", 4):  # the lesson's
            pp = 8
        return {"name": name, "pp": pp, "serving": serving}

    def cost(p):
        return refit_cost(MODELS[p["name"]], H100_80GB, dp=2, pp=p["pp"], tp=8,
                          serving=p["serving"])

    def right(p):
        return cost(p).network_bytes / GB

    def text(p):
        return (f"{p['name']} is trained in bf16 at (dp 2, pp {p['pp']}, tp 8) on DGX H100 "
                "nodes, each pipeline stage a node, and served at tp 8 "
                f"{SERVING[p['serving']]}. By minitp's count of its parameters "
                "(`mt.calc.exact_param_count`), how many GB (10**9 bytes) must reach one "
                "serving GPU over InfiniBand in a refit? (Within 1%.)")

    def worked(p):
        c = cost(p)
        held = (f"it holds its own stage's share already, 1/{p['pp']} of it, so "
                f"{(c.need_bytes - c.local_bytes) / GB:,.2f} GB cross"
                if p["serving"] == "collocated" else
                "it holds none of the training shards: all of it crosses")
        return (f"the model is {c.weight_bytes / GB:,.1f} GB in bf16; a serving GPU keeps its "
                f"tp slice, 1/8 of it, {c.need_bytes / GB:,.2f} GB; {held} (a MODEL, "
                f"`mt.calc.refit_cost`: {1e3 * c.seconds:,.0f} ms at 50 GB/s a GPU, against "
                f"{c.broadcast_seconds:,.1f} s for the whole model gathered to one GPU and "
                "broadcast).")

    return Question(
        key="19.refit-bytes", seed=seed, draw=draw, text=text, right=right, worked=worked,
        wrong=[
            Wrong(lambda p: cost(p).weight_bytes / GB, "that is the whole model: what a "
                  "naive broadcast sends every GPU; a serving GPU keeps only its tp slice"),
            Wrong(lambda p: (cost(p).need_bytes * (1 - 1 / p["pp"]) if p["serving"] == "separate"
                             else cost(p).need_bytes) / GB,
                  "that swaps the two placements: collocated, a GPU already holds its own "
                  "stage's share of its slice (1/pp of it), which stays put; separate, it holds "
                  "nothing of the training and all of its slice crosses"),
            Wrong(lambda p: cost(p).need_bytes / p["pp"] / GB,
                  "that is one stage's share of the slice: a serving GPU keeps every layer"),
        ])


def what_stays_equal(seed=None) -> Question:
    def draw(rng):
        trainer = rng.choice((2, 4, 8))
        generator = trainer if rng.random() < 0.5 else rng.choice(
            [t for t in (1, 2, 4, 8) if t != trainer])
        return {"trainer": trainer, "generator": generator,
                "invariant": rng.random() < 0.5}

    def right(p):
        return "a" if p["invariant"] and p["trainer"] == p["generator"] else "b"

    def text(p):
        kernels = ("with batch-invariant kernels on both sides (torchtitan's batch-invariant "
                   "mode: a fixed tile order in every GEMM and log-softmax, attention's "
                   "split-k off, NCCL's all-reduce pinned to one tree, TF32 off)"
                   if p["invariant"] else "with the GPU libraries' default kernels")
        return (f"An RL loop trains in bf16 at tp {p['trainer']} on GPUs and refits the "
                f"weights, through collectives, to a generator serving at tp "
                f"{p['generator']}, {kernels}. The generator samples tokens; the trainer "
                "then scores the same tokens in one forward. Answer 'a', 'b' or 'c': (a) "
                "the weights and the log-probabilities are equal bit for bit; (b) the "
                "weights are equal bit for bit, the log-probabilities may differ; (c) the "
                "weights may differ too.")

    def worked(p):
        why = ("the same tp and kernels that do not pick their order from the shape: every "
               "sum is taken in the same order on both sides" if right(p) == "a" else
               f"tp {p['trainer']} against tp {p['generator']}: a row-parallel layer sums "
               f"{p['trainer']} partial products on one side, {p['generator']} on the other "
               "(the reduction order across tp, which torchtitan's parity also excludes: "
               "'the same tensor parallelism degree')" if p["trainer"] != p["generator"]
               else "the generator decodes a token at a time, the trainer runs the whole "
               "sequence: other GEMM shapes, so other tilings and split-k choices")
        return (f"a refit moves bits (bf16 stays bf16, nothing is recomputed), so the weights "
                f"are equal. The log-probabilities: {why}. Here: ({right(p)}).")

    return Question(
        key="19.what-stays-equal", seed=seed, draw=draw, kind="choice", text=text,
        right=right, worked=worked,
        wrong=[
            Wrong(lambda p: "c", "a refit sends the trainer's own bits (or a checkpoint's: "
                                 "bf16 stays bf16); nothing in the move rounds"),
            Wrong(lambda p: "a" if right(p) == "b" else "b",
                  "equal weights are not equal sums: see which reductions change order "
                  "between the two sides (tp, the GEMM shapes, the kernels)"),
        ])


QUESTIONS = {"19.refit-bytes": refit_bytes, "19.what-stays-equal": what_stays_equal}
