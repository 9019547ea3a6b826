"""Lesson 20's questions: model-state GB per GPU in the two layouts, training days by
Narayanan et al.'s rule, and a 16-bytes-per-parameter claim judged."""

from __future__ import annotations

from ...calc.counts.flops import training_seconds
from ...calc.footprint.memory import OPTIMIZERS, model_state_bytes
from .form import Question, Wrong

GB, GiB, DAY = 10**9, 2**30, 86400
LAYOUTS = {"adam-mixed": "bf16 weights and bf16 gradients (ZeRO's count, Rajbhandari et al. "
                         "2020, §3.1)",
           "megatron": "bf16 weights and gradients accumulated in fp32 (Megatron-LM)"}


def state_gb(seed=None) -> Question:
    def draw(rng):
        return {"billions": rng.choice((13, 22, 39, 76)), "gpus": rng.choice((8, 16, 32)),
                "layout": rng.choice(tuple(LAYOUTS))}

    def per_gpu(p):
        return p["billions"] * 10**9 // p["gpus"]

    def gb(p, layout=None):
        return model_state_bytes(per_gpu(p), optimizer=layout or p["layout"])["total"] / GB

    def other(p):
        return "megatron" if p["layout"] == "adam-mixed" else "adam-mixed"

    def per_param(p, layout=None):
        return sum(OPTIMIZERS[layout or p["layout"]])

    return Question(
        key="20.state-gb", seed=seed, draw=draw,
        text=lambda p: (f"A {p['billions']}B-parameter model is split evenly over {p['gpus']} "
                        "GPUs by tensor and pipeline parallelism (no ZeRO). It trains with "
                        f"mixed-precision Adam: {LAYOUTS[p['layout']]}, an fp32 master copy "
                        "and Adam's two fp32 moments. How many GB of model states does each GPU "
                        "hold? (GB, 10^9 bytes; within 1%.)"),
        right=gb,
        wrong=[
            Wrong(lambda p: gb(p, other(p)),
                  "that is the other layout (16 or 18 bytes a parameter): check in which "
                  "precision the gradients are kept"),
            Wrong(lambda p: 2 * per_gpu(p) / GB,
                  "that is the bf16 weights alone; training also keeps gradients, an fp32 master "
                  "copy and Adam's two moments"),
            Wrong(lambda p: gb(p) * GB / GiB, "that is in GiB (2^30 bytes); the question asks "
                                              "for GB (10^9)"),
            Wrong(lambda p: (per_param(p) - 4) * per_gpu(p) / GB,
                  "that leaves out the fp32 master copy (4 bytes): Adam updates fp32 weights, "
                  "and the bf16 weights are a copy of them"),
        ],
        worked=lambda p: (
            f"{p['billions']}B / {p['gpus']} = {per_gpu(p) / 1e9:.4g}B parameters per GPU; per "
            f"parameter 2 (bf16 weights) + {OPTIMIZERS[p['layout']][1]} (gradients) + 4 (fp32 "
            f"master) + 4 + 4 (Adam's moments) = {per_param(p)} bytes: {gb(p):.2f} GB "
            "(`calc.model_state_bytes`). Activations come on top."),
    )


GPUS = {"A100": (312e12, "NVIDIA's A100 datasheet, dense bf16"),
        "H100": (989e12, "NVIDIA's H100 datasheet, SXM, dense bf16")}


def training_days(seed=None) -> Question:
    def draw(rng):
        return {"billions": rng.choice((13, 70, 175)), "tokens": rng.choice((300, 1000)),
                "gpus": rng.choice((512, 1024, 2048)), "gpu": rng.choice(tuple(GPUS)),
                "eff": rng.choice((0.35, 0.45, 0.5)), "full": rng.choice((True, False))}

    def days(p, flops_per_token=None, achieved=True):
        peak = GPUS[p["gpu"]][0]
        per_gpu = peak * p["eff"] if achieved else peak
        rule = flops_per_token or (8 if p["full"] else 6)
        seconds = training_seconds(p["tokens"] * 1e9, p["billions"] * 1e9, p["gpus"], per_gpu)
        return seconds * rule / 8 / DAY  # training_seconds is Eq. 4's 8 FLOPs a token

    def text(p):
        peak, source = GPUS[p["gpu"]]
        recompute = ("recomputes every layer's forward in backward (full recomputation)"
                     if p["full"] else "recomputes nothing")
        return (f"A {p['billions']}B-parameter GPT trains on {p['tokens']}B tokens on "
                f"{p['gpus']} {p['gpu']}s (peak {peak / 1e12:.0f} TFLOP/s, {source}), each "
                f"achieving {p['eff']:.0%} of its peak. The run {recompute}. By Narayanan et "
                "al. 2021's rule (2 FLOPs a parameter a token forward, twice that backward, "
                "and the forward again when recomputing), how many days does training take? "
                "(Days; within 1%.)")

    def rule(p):
        return 8 if p["full"] else 6

    return Question(
        key="20.training-days", seed=seed, draw=draw, text=text, right=days,
        wrong=[
            Wrong(lambda p: days(p, 14 - rule(p)),
                  "that uses the other rule: 6 FLOPs a parameter a token without "
                  "recomputation, 8 with it (the forward runs twice)"),
            Wrong(lambda p: days(p, achieved=False),
                  "that runs the GPUs at their peak: each achieves only the stated fraction "
                  "of it"),
            Wrong(lambda p: days(p, 2), "that counts the forward pass only: backward costs "
                                        "twice the forward"),
            Wrong(lambda p: days(p) * DAY, "that is in seconds: a day has 86,400"),
            Wrong(lambda p: days(p) * 24, "that is in hours: divide by 24"),
        ],
        worked=lambda p: (
            f"{rule(p)} FLOPs a parameter a token × {p['billions']}e9 parameters × "
            f"{p['tokens']}e9 tokens = {rule(p) * p['billions'] * p['tokens'] * 1e18:.3e} "
            f"FLOPs, over {p['gpus']} GPUs × {p['eff']:.0%} × "
            f"{GPUS[p['gpu']][0] / 1e12:.0f} TFLOP/s = "
            f"{p['gpus'] * p['eff'] * GPUS[p['gpu']][0]:.3e} FLOP/s: {days(p):.3g} days (a "
            "MODEL: Eq. 4 of Narayanan et al. 2021, `calc.training_seconds`, which has the 8; "
            "scaled by 6/8 without recomputation)."),
    )


def sixteen_bytes(seed=None) -> Question:
    def draw(rng):
        return {"billions": rng.choice((7, 13, 30, 70))}

    def gb(p, per_param):
        return per_param * p["billions"]  # billions of parameters × bytes = GB

    return Question(
        key="20.sixteen-bytes", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A write-up says: \"training this {p['billions']}B model with "
                        "Megatron-LM needs 16 bytes a parameter of model states, "
                        f"{gb(p, 16):,} GB.\" The run keeps bf16 weights, accumulates its "
                        "gradients over the microbatches in fp32, and runs Adam with an fp32 "
                        "master copy. What do you answer? Answer 'a', 'b', 'c' or 'd': (a) it "
                        "holds: 2 + 2 + 12; (b) too low: 18 bytes a parameter, "
                        f"{gb(p, 18):,} GB, because the gradients take 4 bytes; (c) too high: "
                        f"14 bytes, {gb(p, 14):,} GB, because the fp32 master copy is the "
                        "weights; (d) too low: model states include the activations."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "2 + 2 + 12 is ZeRO's count, with 16-bit gradients; this run "
                                 "accumulates them in fp32, 4 bytes"),
            Wrong(lambda p: "c", "the master copy is a second copy: the bf16 weights the "
                                 "matrix multiplies read are made from it, and both are kept"),
            Wrong(lambda p: "d", "model states are the weights, gradients and optimizer state; "
                                 "activations are a separate term, and they depend on the batch"),
        ],
        worked=lambda p: (
            "per parameter: 2 (bf16 weights) + 4 (fp32 gradients) + 4 (fp32 master) + 4 + 4 "
            f"(Adam's moments) = 18 bytes (`calc.OPTIMIZERS['megatron']`): {gb(p, 18):,} GB, "
            f"not {gb(p, 16):,} GB. A claim that does not say where the gradients accumulate is "
            "ambiguous by 12%."),
    )


QUESTIONS = {"20.state-gb": state_gb, "20.training-days": training_days,
             "20.sixteen-bytes": sixteen_bytes}
