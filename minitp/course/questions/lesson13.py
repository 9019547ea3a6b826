"""Lesson 13's questions: the one sum over tp a replicated encoder needs under sequence
parallelism, the all-reduces of a tensor-parallel encoder, and which layout the model
finds faster (the course's source: the Megatron-LM tensor-parallelism write-up, §5
"Multi-GPU VLM training"; `minitp.tensor_parallel.vision` runs both layouts)."""

from __future__ import annotations

import math
from dataclasses import replace

from ...calc.cluster import H100_80GB
from ...calc.vision import LLAVA15_VISION, vision_encoder_params, vision_layout
from ...calc.vision_time import vision_crossover
from .form import Question, Wrong

LETTERS = "abcd"
MiB = 2**20
# The same vision tower (CLIP ViT-L/14 at 336 px) into LLaVA-1.5's two decoders: Vicuna-13B
# (d_model 5120, `LLAVA15_VISION`) and Vicuna-7B (d_model 4096, LLaMA-7B's dimension:
# Touvron et al. 2023, "LLaMA", Table 2; Liu et al. 2023, arXiv 2310.03744, trains both).
ENCODERS = {"13B": LLAVA15_VISION,
            "7B": replace(LLAVA15_VISION, name="LLaVA-1.5-7B's encoder (CLIP ViT-L/14, 336 px)",
                          d_model=4096)}


def _distinct(q: Question) -> Question:
    """Keep the usual mistakes whose value differs, for this draw, from the right answer and
    from every mistake kept before it (e.g. ×m when m = 1): an answer matches one verdict."""
    kept = [q.right(q.params)]
    wrong = []
    for mistake in q.wrong:
        value = mistake.value(q.params)
        if not any(math.isclose(value, k, rel_tol=2 * q.rel_tol) for k in kept):
            wrong.append(mistake)
            kept.append(value)
    q.wrong = wrong
    return q


def _about(shape) -> str:
    return (f"{shape.name} as minitp models it: {shape.layers} blocks {shape.width} wide, "
            f"{shape.patches} patches an image, projected into the decoder's d_model "
            f"{shape.d_model}")


def encoder_sum(seed=None) -> Question:
    def draw(rng):
        return {"enc": rng.choice(tuple(ENCODERS)), "t": rng.choice((2, 4, 8)),
                "b": rng.choice((1, 2, 4, 8, 16)), "m": rng.choice((4, 8))}

    def mib(p, grad_bytes=4):
        cost = vision_layout(ENCODERS[p["enc"]], "replicated", p["t"], p["b"], p["m"],
                             sequence_parallel=True, grad_bytes=grad_bytes)
        return cost.tp_bytes_per_step / MiB

    def n(p):
        return vision_encoder_params(ENCODERS[p["enc"]])

    return _distinct(Question(
        key="13.encoder-sum", seed=seed, draw=draw,
        text=lambda p: (f"{_about(ENCODERS[p['enc']])} (n = {n(p):,} parameters, "
                        "`mt.calc.vision_encoder_params`), sits \"replicated\" beside a "
                        f"decoder tensor-parallel over tp = {p['t']} ranks WITH sequence "
                        f"parallelism. An optimizer step has m = {p['m']} microbatches of "
                        f"b = {p['b']} images. minitp's mixed precision: bf16 activations, "
                        "float32 gradients (main_grad). How many MiB is the tensor one rank "
                        "all-reduces over tp in one optimizer step for the encoder's "
                        "gradients (the size of the tensor summed)? (In MiB; within 1%.)"),
        right=mib,
        wrong=[
            Wrong(lambda p: 0.0,
                  "no all-reduce: the encoder's gradients not reduced over tp. Under sequence "
                  "parallelism each rank places only its slice's image tokens, so its encoder "
                  "gradient is one term of the sum; without the sum the copies drift apart, "
                  "silently"),
            Wrong(lambda p: mib(p) * p["m"],
                  "that is once per microbatch; the sum is once per step: the partial gradients "
                  "accumulate over the microbatches and are summed once, after the last, with "
                  "the other partial gradients"),
            Wrong(lambda p: mib(p) * 2 * (p["t"] - 1) / p["t"],
                  "that is 2(t−1)/t of it, what a rank sends in a ring all-reduce "
                  "(`ring_wire_bytes`), not the size of the reduced tensor"),
            Wrong(lambda p: mib(p, grad_bytes=2),
                  "that is in bf16: the gradients are float32 (main_grad, 4 bytes) under "
                  "minitp's mixed precision"),
        ],
        worked=lambda p: (
            f"every encoder parameter's gradient, summed once per step: n × 4 bytes = "
            f"{n(p):,} × 4 = {mib(p):.1f} MiB (`mt.calc.vision_layout(..., \"replicated\", "
            "sequence_parallel=True, grad_bytes=4).tp_bytes_per_step`, a MODEL). Neither b, "
            f"m = {p['m']} nor tp = {p['t']} changes it; a ring all-reduce sends 2(t−1)/t of "
            f"it, {mib(p) * 2 * (p['t'] - 1) / p['t']:.1f} MiB, per rank. In minitp these "
            "gradients are tagged `grad_partial_over_tp` and summed with the other partial "
            "ones (`partial_grads.py`)."),
    ))


def split_bytes(seed=None) -> Question:
    def draw(rng):
        return {"enc": rng.choice(tuple(ENCODERS)), "t": rng.choice((2, 4, 8)),
                "b": rng.choice((1, 2, 4, 8, 16)), "m": rng.choice((1, 4, 8)),
                "sp": rng.choice((True, False))}

    def mib(p, sp=None):
        cost = vision_layout(ENCODERS[p["enc"]], "tensor", p["t"], p["b"], p["m"],
                             sequence_parallel=p["sp"] if sp is None else sp,
                             bytes_per_value=2)
        return cost.tp_bytes_per_step / MiB

    def blocks(p):  # the per-layer all-reduces' part: the whole without sequence parallelism
        return mib(p, sp=False)

    return _distinct(Question(
        key="13.split-bytes", seed=seed, draw=draw,
        text=lambda p: (f"{_about(ENCODERS[p['enc']])}, runs in the \"tensor\" layout over "
                        f"tp = {p['t']} ranks: its blocks split as the decoder's (qkv and fc "
                        "by columns, the projections by rows), patch embedding, positions, "
                        "LayerNorms and projector whole. The decoder runs "
                        + ("WITH" if p["sp"] else "WITHOUT")
                        + f" sequence parallelism. An optimizer step has m = {p['m']} "
                        f"microbatch{'es' if p['m'] > 1 else ''} of b = {p['b']} images; "
                        "activations in bf16. How many MiB do all the encoder's all-reduces "
                        "over tp carry in one optimizer step, adding up their payloads (the "
                        "tensors' sizes, not the ring's wire bytes)? (In MiB; within 1%.)"),
        right=mib,
        wrong=[
            Wrong(lambda p: mib(p) - blocks(p) / 2,
                  "that counts the forward's 2 all-reduces per layer (after the two row-"
                  "parallel projections) only; backward has 2 more, where forward copied the "
                  "input to qkv and to fc"),
            Wrong(blocks,
                  "that leaves out the image tokens' all-reduce: under sequence parallelism the "
                  "projector's output is copied to every rank before each takes its slice, so "
                  "backward sums its gradient, b·P·d values, once per microbatch"),
            Wrong(lambda p: mib(p) / p["m"],
                  "that is one microbatch's; each of the step's m microbatches has its own "
                  "all-reduces (activations are not accumulated as gradients are)"),
            Wrong(lambda p: mib(p) - blocks(p) + blocks(p) / ENCODERS[p["enc"]].layers,
                  "that is one encoder layer's 4 all-reduces; each of the L layers has its own"),
        ],
        worked=lambda p: (
            f"per microbatch and layer 2 all-reduces forward and 2 backward of b·P·w = "
            f"{p['b']}·{ENCODERS[p['enc']].patches}·{ENCODERS[p['enc']].width} values "
            f"(2 bytes each, bf16), × L = "
            f"{ENCODERS[p['enc']].layers} × m = {p['m']}: {blocks(p):.1f} MiB"
            + (f"; with sequence parallelism one more per microbatch, backward, of b·P·d = "
               f"{p['b']}·{ENCODERS[p['enc']].patches}·{ENCODERS[p['enc']].d_model} values: "
               f"{mib(p) - blocks(p):.1f} MiB; in all {mib(p):.1f} MiB" if p["sp"] else "")
            + " (`mt.calc.vision_layout(..., \"tensor\", ...)"
            ".tp_bytes_per_step`, a MODEL), whatever tp."),
    ))


def which_layout(seed=None) -> Question:
    def draw(rng):
        order = list(range(4))
        rng.shuffle(order)  # where each kind of answer sits among (a)-(d)
        # b = 1 gives "replicated" at every tp, b = 16 "tensor"; between, it depends on tp
        return {"t": rng.choice((2, 4, 8)), "b": rng.choice((1, 2, 4, 8, 16)), "order": order}

    def cross(p):
        return vision_crossover(LLAVA15_VISION, H100_80GB, p["t"], p["b"])

    def answers(p):
        t, n = p["t"], 4 * LLAVA15_VISION.layers
        return [f"\"replicated\": splitting would cost 4L = {n} all-reduces of b·P·w values "
                f"a microbatch, more time than the (1 − 1/{t}) of the blocks' compute it saves",
                f"\"tensor\": splitting saves (1 − 1/{t}) of the blocks' compute, more time than "
                f"its 4L = {n} all-reduces of b·P·w values a microbatch cost",
                "\"replicated\": without sequence parallelism it sends nothing at all over tp",
                f"\"tensor\": each rank holds only 1/{t} of the blocks' weights"]

    def letter(p, kind):
        return LETTERS[p["order"].index(kind)]

    def winner(p):  # kind 0 or 1: the calc's verdict
        return 0 if cross(p).winner == "replicated" else 1

    def worked(p):
        c = cross(p)
        ms = {k: 1e3 * v for k, v in c.seconds.items()}
        return (f"`mt.calc.vision_crossover(mt.calc.LLAVA15_VISION, mt.calc.H100_80GB, "
                f"{p['t']}, {p['b']})`, a MODEL (50% MFU of 989 TFLOP/s, the α–β ring over "
                f"NVLink at 450 GB/s, nothing overlapped), per microbatch: \"replicated\" "
                f"{ms['replicated']:.2f} ms (all compute), \"tensor\" {ms['tensor']:.2f} ms "
                f"({1e3 * c.compute_seconds['tensor']:.2f} compute + "
                f"{1e3 * c.tp_seconds['tensor']:.2f} all-reduces): \"{c.winner}\" is faster: "
                f"({letter(p, winner(p))}). The two cost the same at width w* ≈ "
                f"{c.width:.0f} (\"{c.below}\" below, \"{c.above}\" above); CLIP ViT-L's is "
                f"{LLAVA15_VISION.width}. The saving grows as b·P·w² and the all-reduces as "
                "b·P·w plus a latency per message, so bigger batches of images and wider "
                "encoders favour the split. Memory does not enter the time.")

    return Question(
        key="13.which-layout", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"{_about(LLAVA15_VISION)}, trains beside a decoder tensor-parallel over "
                        f"tp = {p['t']} ranks of a DGX H100 (`mt.calc.H100_80GB`), b = {p['b']} "
                        f"image{'s' if p['b'] > 1 else ''} a microbatch, no sequence "
                        "parallelism. Which layout of the encoder does the MODEL "
                        "(`mt.calc.vision_crossover` / `vision_step_time`) find faster, and "
                        "why? " + "; ".join(f"({LETTERS[k]}) {answers(p)[p['order'][k]]}"
                                            for k in range(4)) + "."),
        right=lambda p: letter(p, winner(p)),
        wrong=[
            Wrong(lambda p: letter(p, 1 - winner(p)),
                  "that is the layout the model finds slower at these sizes: weigh the "
                  "(1 − 1/t) of the blocks' compute the split saves against its 4L all-reduces "
                  "a microbatch (the worked answer's two times)"),
            Wrong(lambda p: letter(p, 2),
                  "without sequence parallelism the replicated encoder does send nothing, but "
                  "that decides nothing by itself: every rank pays the whole encoder's compute, "
                  "and it wins only when that costs less than the split's all-reduces"),
            Wrong(lambda p: letter(p, 3),
                  "memory is not the question: the split does hold 1/t of the blocks' weights, "
                  "but the question is time, compute saved against all-reduces paid"),
        ],
        worked=worked,
    )


QUESTIONS = {"13.encoder-sum": encoder_sum, "13.split-bytes": split_bytes,
             "13.which-layout": which_layout}
