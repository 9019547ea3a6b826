"""Lesson 15's questions: what a replicated encoder sums over tp under sequence
parallelism, frozen or trained; what a tensor-parallel encoder's all-reduces carry; and
which layout the model finds faster. The frozen case is LLaVA's recipe (Liu et al. 2023,
arXiv 2304.08485, §4.2: the visual encoder's weights stay frozen; LLaVA-1.5 keeps it), the
trained one as in Qwen2-VL's second stage (Wang et al. 2024, arXiv 2409.12191, §2.2:
every parameter unfrozen). `mt.calc.architectures.vision` prices both (a MODEL);
`minitp.tensor_parallel.vision` runs both layouts, trained."""

from __future__ import annotations

import math
from dataclasses import replace

from ...calc.architectures.vision import LLAVA15_VISION, vision_encoder_params, vision_layout
from ...calc.architectures.vision_time import vision_crossover
from ...calc.network.cluster import H100_80GB
from .form import Question, Wrong

LETTERS = "abcd"
MiB = 2**20
# The same vision tower (CLIP ViT-L/14 at 336 px) into LLaVA-1.5's two decoders: Vicuna-13B
# (d_model 5120, `LLAVA15_VISION`) and Vicuna-7B (d_model 4096, LLaMA-7B's dimension:
# Touvron et al. 2023, "LLaMA", Table 2; Liu et al. 2023, arXiv 2310.03744, trains both).
ENCODERS = {"13B": LLAVA15_VISION,
            "7B": replace(LLAVA15_VISION, name="LLaVA-1.5-7B's encoder (CLIP ViT-L/14, 336 px)",
                          d_model=4096)}
FROZEN = ("FROZEN, the projector alone trained beside the decoder (LLaVA-1.5's recipe)")
TRAINED = ("TRAINED with the rest (every parameter unfrozen, as in Qwen2-VL's second stage)")


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
            f"{shape.patches} patches an image, a projector Linear({shape.width} → "
            f"{shape.d_model}) with bias into the decoder's d_model {shape.d_model}")


def _how(p) -> str:
    return FROZEN if p["frozen"] else TRAINED


def encoder_sum(seed=None) -> Question:
    def draw(rng):
        return {"enc": rng.choice(tuple(ENCODERS)), "t": rng.choice((2, 4, 8)),
                "b": rng.choice((1, 2, 4, 8, 16)), "m": rng.choice((4, 8)),
                "frozen": rng.choice((True, False))}

    def mib(p, grad_bytes=4, frozen=None):
        cost = vision_layout(ENCODERS[p["enc"]], "replicated", p["t"], p["b"], p["m"],
                             sequence_parallel=True, grad_bytes=grad_bytes,
                             frozen=p["frozen"] if frozen is None else frozen)
        return cost.tp_bytes_per_step / MiB

    def n(p):
        return vision_encoder_params(ENCODERS[p["enc"]])

    def worked(p):
        s = ENCODERS[p["enc"]]
        what = (f"the projector's gradients only, w·d + d = {s.width}·{s.d_model} + "
                f"{s.d_model} = {s.width * s.d_model + s.d_model:,} values: a frozen encoder "
                "has no gradient (no backward runs through it), but each rank's projector "
                "gradient comes from its slice's image tokens only, so it is partial"
                if p["frozen"] else
                f"every encoder parameter's gradient, n = {n(p):,} values")
        return (f"{what}, × 4 bytes (float32), summed once per step: {mib(p):.2f} MiB "
                "(`mt.calc.vision_layout(..., \"replicated\", sequence_parallel=True, "
                f"grad_bytes=4, frozen={p['frozen']}).tp_bytes_per_step`, a MODEL). Neither b, "
                f"m = {p['m']} nor tp = {p['t']} changes it; a ring all-reduce sends 2(t−1)/t "
                f"of it, {mib(p) * 2 * (p['t'] - 1) / p['t']:.2f} MiB, per rank. In minitp "
                "these gradients are tagged `grad_partial_over_tp` and summed with the other "
                "partial ones (`partial_grads.py`).")

    return _distinct(Question(
        key="15.encoder-sum", seed=seed, draw=draw,
        text=lambda p: (f"{_about(ENCODERS[p['enc']])} (n = {n(p):,} parameters in all, "
                        "`mt.calc.vision_encoder_params`), sits \"replicated\" beside a "
                        f"decoder tensor-parallel over tp = {p['t']} ranks WITH sequence "
                        f"parallelism. The encoder is {_how(p)}. An optimizer step has "
                        f"m = {p['m']} microbatches of b = {p['b']} images. minitp's mixed "
                        "precision: bf16 activations, float32 gradients (main_grad). How many "
                        "MiB is the tensor one rank all-reduces over tp in one optimizer step "
                        "for the vision side's gradients (the size of the tensor summed)? "
                        "(In MiB; within 1%.)"),
        right=mib,
        wrong=[
            Wrong(lambda p: mib(p, frozen=not p["frozen"]),
                  "that is the other case's sum: a frozen encoder has no gradients to sum, only "
                  "its projector does (w·d + d of them); a trained one sums all n"),
            Wrong(lambda p: 0.0,
                  "nothing summed: under sequence parallelism each rank places only its slice's "
                  "image tokens, so the gradient it computes for the vision side (the "
                  "projector's at least) is one term of the sum; without the sum the copies "
                  "drift apart, silently"),
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
        worked=worked,
    ))


def split_bytes(seed=None) -> Question:
    def draw(rng):
        return {"enc": rng.choice(tuple(ENCODERS)), "t": rng.choice((2, 4, 8)),
                "b": rng.choice((1, 2, 4, 8, 16)), "m": rng.choice((1, 4, 8)),
                "sp": rng.choice((True, False)), "frozen": rng.choice((True, False))}

    def mib(p, sp=None, frozen=None):
        cost = vision_layout(ENCODERS[p["enc"]], "tensor", p["t"], p["b"], p["m"],
                             sequence_parallel=p["sp"] if sp is None else sp,
                             bytes_per_value=2, grad_bytes=4,
                             frozen=p["frozen"] if frozen is None else frozen)
        return cost.tp_bytes_per_step / MiB

    def blocks(p, frozen=None):  # the blocks' all-reduces: the whole without SP
        return mib(p, sp=False, frozen=frozen)

    def sp_part(p):
        return mib(p) - blocks(p)

    def other_sp_part(p):  # the SP all-reduce of the other case, in place of this one's
        return mib(p, sp=True, frozen=not p["frozen"]) - blocks(p, frozen=not p["frozen"])

    def worked(p):
        s = ENCODERS[p["enc"]]
        count = 2 if p["frozen"] else 4
        why = ("forward only, after the two row-parallel projections: a frozen encoder runs "
               "no backward" if p["frozen"] else "2 forward and 2 backward")
        text = (f"per microbatch and layer {count} all-reduces ({why}) of b·P·w = "
                f"{p['b']}·{s.patches}·{s.width} values (2 bytes each, bf16), × L = "
                f"{s.layers} × m = {p['m']}: {blocks(p):.2f} MiB")
        if p["sp"] and p["frozen"]:
            text += (f"; with sequence parallelism the whole projector's gradients, partial on "
                     f"each rank, summed once per step: (w·d + d) × 4 bytes = "
                     f"{sp_part(p):.2f} MiB (the blocks need no gradient, so the image tokens' "
                     f"gradient is never made whole); in all {mib(p):.2f} MiB")
        elif p["sp"]:
            text += (f"; with sequence parallelism one more per microbatch, backward, of "
                     f"b·P·d = {p['b']}·{s.patches}·{s.d_model} values: {sp_part(p):.2f} MiB; "
                     f"in all {mib(p):.2f} MiB")
        return text + (" (`mt.calc.vision_layout(..., \"tensor\", ..., grad_bytes=4, "
                       f"frozen={p['frozen']}).tp_bytes_per_step`, a MODEL), whatever tp.")

    return _distinct(Question(
        key="15.split-bytes", seed=seed, draw=draw,
        text=lambda p: (f"{_about(ENCODERS[p['enc']])}, runs in the \"tensor\" layout over "
                        f"tp = {p['t']} ranks: its blocks split as the decoder's (qkv and fc "
                        "by columns, the projections by rows), patch embedding, positions, "
                        f"LayerNorms and projector whole. The encoder is {_how(p)}. The "
                        "decoder runs " + ("WITH" if p["sp"] else "WITHOUT")
                        + f" sequence parallelism. An optimizer step has m = {p['m']} "
                        f"microbatch{'es' if p['m'] > 1 else ''} of b = {p['b']} images; "
                        "activations in bf16, gradients in float32. How many MiB do all the "
                        "vision side's all-reduces over tp carry in one optimizer step, adding "
                        "up their payloads (the tensors' sizes, not the ring's wire bytes)? "
                        "(In MiB; within 1%.)"),
        right=mib,
        wrong=[
            Wrong(lambda p: blocks(p, frozen=not p["frozen"]) + sp_part(p),
                  "the blocks' all-reduces of the other case: a trained encoder's layer has 2 "
                  "forward and 2 backward (where forward copied the input to qkv and to fc); a "
                  "frozen one has no backward, so only the forward's 2"),
            Wrong(lambda p: blocks(p) + other_sp_part(p),
                  "the sequence-parallel all-reduce of the other case: a trained split "
                  "encoder needs its output's whole gradient (b·P·d values, once per "
                  "microbatch); a frozen one needs none, and only its whole projector's "
                  "partial gradients (w·d + d, float32) are summed once a step"),
            Wrong(blocks,
                  "that leaves out the all-reduce sequence parallelism adds: the image "
                  "tokens' gradient (trained) or the projector's partial gradients (frozen)"),
            Wrong(lambda p: mib(p) / p["m"],
                  "that is one microbatch's; each of the step's m microbatches has its own "
                  "all-reduces (activations are not accumulated as gradients are)"),
            Wrong(lambda p: sp_part(p) + blocks(p) / ENCODERS[p["enc"]].layers,
                  "that is one encoder layer's all-reduces; each of the L layers has its own"),
        ],
        worked=worked,
    ))


def which_layout(seed=None) -> Question:
    def draw(rng):
        order = list(range(4))
        rng.shuffle(order)  # where each kind of answer sits among (a)-(d)
        # b = 2..8 (the lesson prints b = 1 and 16 at tp = 8): the verdict turns on t, b and
        # whether the encoder trains
        return {"t": rng.choice((2, 4, 8)), "b": rng.choice((2, 4, 8)), "order": order,
                "frozen": rng.choice((True, False))}

    def cross(p):
        return vision_crossover(LLAVA15_VISION, H100_80GB, p["t"], p["b"], frozen=p["frozen"])

    def answers(p):
        t, n = p["t"], (2 if p["frozen"] else 4) * LLAVA15_VISION.layers
        saved = "the blocks' forward" if p["frozen"] else "the blocks' forward and backward"
        return [f"\"replicated\": splitting would cost {n} all-reduces of b·P·w values a "
                f"microbatch, more time than the (1 − 1/{t}) of {saved} it saves",
                f"\"tensor\": splitting saves (1 − 1/{t}) of {saved}, more time than its "
                f"{n} all-reduces of b·P·w values a microbatch cost",
                "\"replicated\": without sequence parallelism it sends nothing at all over tp",
                f"\"tensor\": each rank holds only 1/{t} of the blocks' weights"]

    def letter(p, kind):
        return LETTERS[p["order"].index(kind)]

    def winner(p):  # kind 0 or 1: the calc's verdict
        return 0 if cross(p).winner == "replicated" else 1

    def worked(p):
        c = cross(p)
        ms = {k: 1e3 * v for k, v in c.seconds.items()}
        work = ("one forward and the projector's weight gradient" if p["frozen"] else
                "3 forwards' worth")
        return (f"`mt.calc.vision_crossover(mt.calc.LLAVA15_VISION, mt.calc.H100_80GB, "
                f"{p['t']}, {p['b']}, frozen={p['frozen']})`, a MODEL (50% MFU of 989 TFLOP/s, "
                "the α–β ring over NVLink at 450 GB/s and 5 µs a hop, nothing overlapped), "
                f"per microbatch ({work}): \"replicated\" {ms['replicated']:.2f} ms (all "
                f"compute), \"tensor\" {ms['tensor']:.2f} ms "
                f"({1e3 * c.compute_seconds['tensor']:.2f} compute + "
                f"{1e3 * c.tp_seconds['tensor']:.2f} all-reduces): \"{c.winner}\" is faster: "
                f"({letter(p, winner(p))}). The two cost the same at width w* ≈ "
                f"{c.width:.0f} (\"{c.below}\" below, \"{c.above}\" above); CLIP ViT-L's is "
                f"{LLAVA15_VISION.width}. The saving grows as b·P·w² and the all-reduces as "
                "b·P·w plus 2(t−1) hops of latency per all-reduce, shared by the b images (w* "
                "depends on t and b through t/b alone), so bigger batches of images and wider "
                "encoders favour the split; a frozen encoder saves only its forward's share, "
                "which moves w* up. Memory does not enter the time.")

    return Question(
        key="15.which-layout", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"{_about(LLAVA15_VISION)}, is {_how(p)}. It runs beside a decoder "
                        f"tensor-parallel over tp = {p['t']} ranks of a DGX H100 "
                        f"(`mt.calc.H100_80GB`), b = {p['b']} images a microbatch, no sequence "
                        "parallelism. Which layout of the encoder does the MODEL "
                        "(`mt.calc.vision_step_time`, half the peak, the α–β ring) find "
                        "faster, and why? "
                        + "; ".join(f"({LETTERS[k]}) {answers(p)[p['order'][k]]}"
                                    for k in range(4)) + "."),
        right=lambda p: letter(p, winner(p)),
        wrong=[
            Wrong(lambda p: letter(p, 1 - winner(p)),
                  "that is the layout the model finds slower at these sizes: weigh the "
                  "(1 − 1/t) of the blocks' compute the split saves against its all-reduces "
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


QUESTIONS = {"15.encoder-sum": encoder_sum, "15.split-bytes": split_bytes,
             "15.which-layout": which_layout}
