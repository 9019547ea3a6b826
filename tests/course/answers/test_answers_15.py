"""Lesson 15: vision-language models.

Every question checked, each from first principles rather than `mt.calc.architectures.vision`: the
parameter counts from minitp's own model built at the question's sizes (on the meta
device: shapes only, no memory), the all-reduces from the layouts' rules as the lesson
states them, and the times from FLOPs at half the peak plus the ring's wire bytes
(`mt.calc.ring_wire_bytes`) over the H100's NVLink."""

import functools

import torch
from answers_common import MiB, asked, close

import minitp as mt
from minitp.course.questions.lesson15 import ENCODERS

NOT_CHECKED = set()


@functools.cache
def counts(enc):
    """(every vision parameter, the projector's) of minitp's VLM at ``enc``'s sizes."""
    s = ENCODERS[enc]
    cfg = mt.GPTConfig.vlm(vocab_size=256, seq_len=s.patches + 16, n_layer=1, n_head=16,
                           d_model=s.d_model, vision_layers=s.layers, vision_width=s.width,
                           vision_heads=s.heads, vision_patches=s.patches)
    with torch.device("meta"):
        model = mt.GPT(cfg)
    params = dict(model.named_parameters())
    vision = sum(p.numel() for n, p in params.items() if n.startswith("vision."))
    return vision, params["vision.proj.weight"].numel() + params["vision.proj.bias"].numel()


def test_13_encoder_sum():
    """Replicated under SP: the gradients there are, once a step, in float32 — all of
    them trained, the projector's alone frozen."""
    for _, p, right in asked("15.encoder-sum"):
        vision, projector = counts(p["enc"])
        assert close(right, 4 * (projector if p["frozen"] else vision) / MiB)


def test_13_split_bytes():
    """Split blocks: 2 all-reduces of b·P·w a layer forward, 2 more backward when trained;
    under SP the output's gradient b·P·d a microbatch (trained) or the projector's
    partial gradients once a step, float32 (frozen)."""
    for _, p, right in asked("15.split-bytes"):
        s = ENCODERS[p["enc"]]
        per_layer = 2 if p["frozen"] else 4
        total = per_layer * s.layers * p["m"] * p["b"] * s.patches * s.width * 2
        if p["sp"]:
            total += (4 * counts(p["enc"])[1] if p["frozen"]
                      else p["m"] * p["b"] * s.patches * s.d_model * 2)
        assert close(right, total / MiB)


def seconds(s, t, b, frozen):
    """One microbatch's seconds, (replicated, tensor), without SP on a DGX H100."""
    h100 = mt.calc.H100_80GB
    L, P, w, d, R = s.layers, s.patches, s.width, s.d_model, h100.peak_flops / 2
    blocks = L * (24 * b * P * w * w + 4 * b * P * P * w)  # matrices, QKᵀ and ·V: 2 a MAC
    rest = 2 * b * P * w * (8 + d)                          # patch embedding and projector
    if frozen:  # one forward, then the projector's weight gradient alone
        rep, ten = blocks + rest + 2 * b * P * w * d, blocks / t + rest + 2 * b * P * w * d
    else:       # backward twice the forward
        rep, ten = 3 * (blocks + rest), 3 * (blocks / t + rest)
    one = (mt.calc.ring_wire_bytes("all_reduce", b * P * w * 2, t) / h100.intra_bandwidth
           + 2 * (t - 1) * h100.intra_latency)
    return rep / R, ten / R + (2 if frozen else 4) * L * one


def test_13_which_layout():
    for _, p, right in asked("15.which-layout"):
        rep, ten = seconds(ENCODERS["13B"], p["t"], p["b"], p["frozen"])
        kind = 0 if rep < ten else 1  # answers 0 and 1: "replicated" and "tensor" faster
        assert right == "abcd"[p["order"].index(kind)]
