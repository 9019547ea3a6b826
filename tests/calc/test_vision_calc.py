"""minitp.calc.architectures.vision, vision_time, vision_stage: a vision-language model's encoder
replicated, split over tp, or on a pipeline stage of its own; trained or frozen.

Pure arithmetic but for tiny torch builds: the parameter count against a module built
here from plain torch layers (and against minitp's own VLM), the FLOPs against torch's
counter (a frozen encoder: its weights' requires_grad off), the bytes and times against
the module docstrings' formulas written out again, and the crossover width against its
closed forms."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import minitp as mt
from minitp import calc
from minitp.calc.architectures.vision import LLAVA15_VISION, VisionEncoderShape

TINY = [VisionEncoderShape("tiny", layers=2, width=12, heads=3, patches=5, d_model=16),
        VisionEncoderShape("one layer", layers=1, width=8, heads=4, patches=7, d_model=6)]
# Under "tensor" these are split over tp; everything else is whole on every rank.
SPLIT = ("qkv.weight", "qkv.bias", "attn_proj.weight", "fc.weight", "fc.bias", "out.weight")


class Block(nn.Module):
    """A GPT-2 block, pre-LayerNorm, biases, fused qkv, GELU MLP 4w wide, not causal."""

    def __init__(self, w, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(w), nn.LayerNorm(w)
        self.qkv, self.attn_proj = nn.Linear(w, 3 * w), nn.Linear(w, w)
        self.fc, self.out = nn.Linear(w, 4 * w), nn.Linear(4 * w, w)

    def forward(self, x):
        B, P, w = x.shape
        q, k, v = (t.view(B, P, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(w, dim=-1))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(w // self.heads), dim=-1)
        x = x + self.attn_proj((att @ v).transpose(1, 2).reshape(B, P, w))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self, s: VisionEncoderShape):
        super().__init__()
        self.patch = nn.Linear(8, s.width)
        self.pos = nn.Parameter(torch.randn(s.patches, s.width))
        self.blocks = nn.ModuleList(Block(s.width, s.heads) for _ in range(s.layers))
        self.ln = nn.LayerNorm(s.width)
        self.proj = nn.Linear(s.width, s.d_model)

    def forward(self, pixels):  # (B, P, 8)
        x = self.patch(pixels) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.proj(self.ln(x))


def numel(module, split=None):
    return sum(p.numel() for n, p in module.named_parameters()
               if split is None or n.endswith(SPLIT) == split)


@pytest.mark.parametrize("shape", TINY, ids=lambda s: s.name)
def test_params_equal_a_torch_build(shape):
    enc = Encoder(shape)
    assert calc.vision_encoder_params(shape) == numel(enc)
    rep = calc.vision_layout(shape, "replicated", tp=1, micro_batch=1)
    assert rep.params == numel(enc)
    assert rep.model_state_bytes == 16 * numel(enc)  # "adam-mixed": 2 + 2 + 12
    whole = numel(enc, split=False)
    for t in [t for t in (1, 2, 3, 4) if shape.heads % t == 0]:
        per_rank = calc.vision_layout(shape, "tensor", tp=t, micro_batch=1).params
        assert per_rank == numel(enc, split=True) // t + whole
        assert per_rank * t - (t - 1) * whole == numel(enc)
        assert calc.vision_layout(shape, "replicated", tp=t, micro_batch=1).params == numel(enc)


def test_params_equal_minitps_vlm():
    cfg = mt.GPTConfig.vlm(vocab_size=256, seq_len=32, n_layer=2, n_head=4, d_model=16,
                           vision_layers=3, vision_width=12, vision_heads=3)
    model = mt.GPT(cfg)
    encoder = sum(p.numel() for n, p in model.named_parameters() if n.startswith("vision."))
    assert calc.vision_encoder_params(VisionEncoderShape.of(cfg)) == encoder


@pytest.mark.parametrize("shape", TINY, ids=lambda s: s.name)
@pytest.mark.parametrize("b,m", [(1, 1), (3, 2)])
def test_flops_equal_torchs_counter(shape, b, m):
    enc = Encoder(shape)
    pixels = torch.rand(b, shape.patches, 8)
    with FlopCounterMode(display=False) as counter:
        for _ in range(m):
            enc(pixels).sum().backward()
    rep = calc.vision_layout(shape, "replicated", 1, b, microbatches=m)
    # the pixels need no gradient: the patch embedding's backward skips its 2·b·P·8·w
    assert counter.get_total_flops() == rep.flops_per_step - m * 2 * b * shape.patches * 8 * (
        shape.width)


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_flops_split_the_blocks(sp):
    s, b, m = LLAVA15_VISION, 2, 3
    outside = 3 * m * (2 * b * s.patches * 8 * s.width + 2 * b * s.patches * s.width * s.d_model)
    rep = calc.vision_layout(s, "replicated", 8, b, m, sp).flops_per_step
    for t in (1, 2, 4, 8, 16):
        ten = calc.vision_layout(s, "tensor", t, b, m, sp).flops_per_step
        assert ten * t - (t - 1) * outside == rep


@pytest.mark.parametrize("m", [1, 2, 5])
def test_bytes_and_collectives(m):
    s, t, b = TINY[0], 3, 2
    L, P, w, d = s.layers, s.patches, s.width, s.d_model
    n = calc.vision_encoder_params(s)
    rep = calc.vision_layout(s, "replicated", t, b, m)
    assert (rep.tp_bytes_per_step, rep.tp_collectives_per_step) == (0, 0)
    rep_sp = calc.vision_layout(s, "replicated", t, b, m, sequence_parallel=True, grad_bytes=4)
    assert (rep_sp.tp_bytes_per_step, rep_sp.tp_collectives_per_step) == (n * 4, 1)
    ten = calc.vision_layout(s, "tensor", t, b, m, bytes_per_value=2)
    assert (ten.tp_bytes_per_step, ten.tp_collectives_per_step) == (4 * L * b * P * w * 2 * m,
                                                                    4 * L * m)
    ten_sp = calc.vision_layout(s, "tensor", t, b, m, sequence_parallel=True)
    assert ten_sp.tp_bytes_per_step == (4 * L * b * P * w + b * P * d) * 2 * m
    assert ten_sp.tp_collectives_per_step == (4 * L + 1) * m
    for layout in ("replicated", "tensor"):  # one rank: nothing to send
        one = calc.vision_layout(s, layout, 1, b, m, sequence_parallel=True)
        assert (one.tp_bytes_per_step, one.tp_collectives_per_step) == (0, 0)


def test_activation_bytes_follow_korthikanti():
    s, b, t = LLAVA15_VISION, 4, 8
    sbh, a_s_h = s.patches * b * s.width, 5 * s.heads * s.patches / s.width
    rep = calc.vision_layout(s, "replicated", t, b)
    ten = calc.vision_layout(s, "tensor", t, b)
    assert rep.activation_bytes == pytest.approx(s.layers * sbh * (34 + a_s_h))
    assert ten.activation_bytes == pytest.approx(s.layers * sbh * (10 + 24 / t + a_s_h / t))
    assert ten.memory_bytes == ten.model_state_bytes + ten.activation_bytes


def all_reduce(nbytes, t, cluster):  # the ring: 2(t−1)/t·S over β, 2(t−1) hops of α
    return 2 * (t - 1) / t * nbytes / cluster.intra_bandwidth + 2 * (t - 1) * cluster.intra_latency


def times(s, w, cluster, t, b, m, sp, mfu=0.5, B=2, frozen=False):
    """Both layouts' seconds at a real width w, from the module docstrings' formulas."""
    L, P, d, R = s.layers, s.patches, s.d_model, cluster.peak_flops * mfu
    blocks, outside = L * (24 * b * P * w * w + 4 * b * P * P * w), 2 * b * P * w * (8 + d)
    if frozen:  # one forward and the projector's weight gradient; its (wd + d) grads summed
        proj = all_reduce(B * (w * d + d), t, cluster) if sp else 0
        rep = m * (blocks + outside + 2 * b * P * w * d) / R + proj
        ten = (m * (blocks / t + outside + 2 * b * P * w * d) / R
               + 2 * L * m * all_reduce(b * P * w * B, t, cluster) + proj)
        return rep, ten
    n = L * (12 * w * w + 13 * w) + (11 + P) * w + w * d + d
    rep = 3 * m * (blocks + outside) / R + (all_reduce(n * B, t, cluster) if sp else 0)
    ten = (3 * m * (blocks / t + outside) / R + 4 * L * m * all_reduce(b * P * w * B, t, cluster)
           + (m * all_reduce(b * P * d * B, t, cluster) if sp else 0))
    return rep, ten


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("b,m,t", [(1, 1, 8), (16, 1, 8), (4, 3, 2), (2, 8, 4)])
def test_step_time_and_crossover(frozen, sp, b, m, t):
    s, h100 = LLAVA15_VISION, calc.H100_80GB
    for layout, expected in zip(("replicated", "tensor"),
                                times(s, s.width, h100, t, b, m, sp, frozen=frozen), strict=True):
        got = calc.vision_step_time(s, h100, layout, t, b, m, sp, frozen=frozen)
        assert got == pytest.approx(expected, rel=1e-12)
    c = calc.vision_crossover(s, h100, t, b, m, sp, frozen=frozen)
    rep, ten = times(s, c.width, h100, t, b, m, sp, frozen=frozen)
    assert rep == pytest.approx(ten, rel=1e-9)
    assert (c.below, c.above) == ("replicated", "tensor")
    assert c.winner == ("tensor" if s.width > c.width else "replicated")
    parts = c.compute_seconds["tensor"] + c.tp_seconds["tensor"]
    assert c.seconds["tensor"] == pytest.approx(parts)
    assert c.costs["tensor"] == calc.vision_layout(s, "tensor", t, b, m, sp, frozen=frozen)


def _terms(latency):
    """H100 (without its latency when ``latency`` is False) and the closed forms' terms."""
    cluster = calc.H100_80GB if latency else dataclasses.replace(calc.H100_80GB, intra_latency=0)
    s = LLAVA15_VISION
    return (cluster, s, 2, cluster.peak_flops * 0.5, cluster.intra_bandwidth,
            cluster.intra_latency, s.patches)


@pytest.mark.parametrize("latency", [True, False])
@pytest.mark.parametrize("b,t", [(1, 8), (16, 8), (2, 2), (8, 4)])
def test_crossover_without_sp_is_the_closed_form(latency, b, t):
    cluster, s, B, R, beta, alpha, P = _terms(latency)
    k = 2 * R * B / beta - 3 * P
    closed = (k + math.sqrt(k * k + 144 * R * t * alpha / (b * P))) / 36
    if not latency:
        assert closed == pytest.approx(R * B / (9 * beta) - P / 6)
    for m in (1, 4):  # free of m (and of L)
        found = calc.vision_crossover(s, cluster, t, b, m).width
        assert found == pytest.approx(closed, rel=1e-9)
    deeper = dataclasses.replace(s, layers=3)
    assert calc.vision_crossover(deeper, cluster, t, b).width == pytest.approx(closed, rel=1e-9)


@pytest.mark.parametrize("latency", [True, False])
@pytest.mark.parametrize("b,t", [(1, 8), (16, 8), (2, 2), (8, 4)])
def test_frozen_crossover_is_its_closed_form_with_or_without_sp(latency, b, t):
    cluster, s, B, R, beta, alpha, P = _terms(latency)
    k = R * B / beta - P
    closed = (k + math.sqrt(k * k + 24 * R * t * alpha / (b * P))) / 12
    if not latency:
        assert closed == pytest.approx((R * B / beta - P) / 6)
    for m, sp in ((1, False), (4, False), (1, True), (4, True)):  # free of m; SP cancels
        found = calc.vision_crossover(s, cluster, t, b, m, sp, grad_bytes=4, frozen=True).width
        assert found == pytest.approx(closed, rel=1e-9)


@pytest.mark.parametrize("shape", TINY, ids=lambda s: s.name)
@pytest.mark.parametrize("b,m", [(1, 1), (3, 2)])
def test_frozen_flops_equal_torchs_counter(shape, b, m):
    """Only the projector trains: no backward through the encoder but its weight gradient."""
    enc = Encoder(shape)
    for name, p in enc.named_parameters():
        p.requires_grad_(name.startswith("proj."))
    pixels = torch.rand(b, shape.patches, 8)
    with FlopCounterMode(display=False) as counter:
        for _ in range(m):
            enc(pixels).sum().backward()
    frozen = calc.vision_layout(shape, "replicated", 1, b, microbatches=m, frozen=True)
    assert counter.get_total_flops() == frozen.flops_per_step
    assert frozen.trainable == sum(p.numel() for p in enc.parameters() if p.requires_grad)
    assert frozen.trainable == calc.projector_params(shape)


@pytest.mark.parametrize("m", [1, 3])
def test_frozen_bytes_states_and_activations(m):
    s, t, b, gb = TINY[0], 3, 2, 4
    L, P, w, d = s.layers, s.patches, s.width, s.d_model
    n, proj = calc.vision_encoder_params(s), w * d + d
    for layout in ("replicated", "tensor"):  # SP: each rank's projector gradient is partial
        cost = calc.vision_layout(s, layout, t, b, m, True, grad_bytes=gb, frozen=True)
        blocks = 2 * L * m if layout == "tensor" else 0  # forward only
        assert cost.tp_collectives_per_step == blocks + 1
        assert cost.tp_bytes_per_step == blocks * b * P * w * 2 + proj * gb
        assert cost.activation_bytes == b * P * w * 2  # the projector's input alone
        assert cost.model_state_bytes == 16 * proj + 2 * (cost.params - proj)
    rep = calc.vision_layout(s, "replicated", t, b, m, frozen=True)
    assert (rep.tp_bytes_per_step, rep.tp_collectives_per_step, rep.params) == (0, 0, n)


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("etp,tp,b", [(1, 8, 1), (2, 8, 4), (4, 4, 16), (8, 8, 2)])
def test_encoder_stage(frozen, etp, tp, b):
    """Its own stage: the "tensor" layout over etp without SP, plus tp/etp sends each way
    of b·P·d values over the link spanning etp + tp ranks."""
    s, h100 = LLAVA15_VISION, calc.H100_80GB
    L, P, w, d, R = s.layers, s.patches, s.width, s.d_model, h100.peak_flops * 0.5
    stage = calc.vision_encoder_stage(s, h100, etp, tp, b, frozen=frozen)
    flops = calc.vision_layout(s, "tensor", etp, b, frozen=frozen).flops_per_step
    assert stage.compute_seconds == pytest.approx(flops / R, rel=1e-12)
    n_ar = (2 if frozen else 4) * L if etp > 1 else 0
    assert stage.tp_seconds == pytest.approx(n_ar * all_reduce(b * P * w * 2, etp, h100),
                                             rel=1e-12)
    alpha, beta = ((h100.intra_latency, h100.intra_bandwidth) if etp + tp <= 8 else
                   (h100.inter_latency, h100.inter_bandwidth))
    assert stage.p2p_bytes == tp // etp * b * P * d * 2
    assert stage.p2p_seconds == pytest.approx(2 * tp // etp * (alpha + b * P * d * 2 / beta),
                                              rel=1e-12)
    assert stage.seconds == pytest.approx(stage.compute_seconds + stage.tp_seconds
                                          + stage.p2p_seconds)
    assert stage.gpus == etp


def test_encoder_stage_errors():
    with pytest.raises(ValueError, match="must divide"):
        calc.vision_encoder_stage(LLAVA15_VISION, calc.H100_80GB, 3, 8, 1)
    with pytest.raises(ValueError, match="does not divide"):
        calc.vision_encoder_stage(TINY[0], calc.H100_80GB, 2, 4, 1)


def test_llava_shape():
    s = LLAVA15_VISION
    assert (s.layers, s.width, s.heads, s.patches, s.d_model) == (24, 1024, 16, 576, 5120)
    w, d, L, P = s.width, s.d_model, s.layers, s.patches
    assert calc.vision_encoder_params(s) == (L * (12 * w * w + 13 * w) + (11 + P) * w
                                             + w * d + d)


def test_errors():
    s = TINY[0]
    with pytest.raises(ValueError, match="'replicated' or 'tensor'"):
        calc.vision_layout(s, "pipeline", 2, 1)
    with pytest.raises(ValueError, match="does not divide heads=3"):
        calc.vision_layout(s, "tensor", 2, 1)
    calc.vision_layout(s, "replicated", 2, 1)  # the whole encoder on every rank: any tp
    for bad in (dict(micro_batch=0), dict(microbatches=-1), dict(tp=0), dict(grad_bytes=0)):
        kw = dict(tp=1, micro_batch=1) | bad
        with pytest.raises(ValueError, match="positive integer"):
            calc.vision_layout(s, "replicated", **kw)
    for field in ("layers", "width", "heads", "patches", "d_model"):
        with pytest.raises(ValueError, match=field):
            calc.vision_encoder_params(dataclasses.replace(s, **{field: 0}))
    with pytest.raises(ValueError, match="not divisible by heads"):
        calc.vision_encoder_params(dataclasses.replace(s, width=13))
    with pytest.raises(ValueError, match="mfu"):
        calc.vision_step_time(s, calc.H100_80GB, "replicated", 1, 1, mfu=0)
    with pytest.raises(ValueError, match="tp >= 2"):
        calc.vision_crossover(s, calc.H100_80GB, 1, 1)


def test_the_whole_models_count_includes_the_encoder_on_the_first_stage():
    """exact_param_count (the CLI's memory check reads it through memory_per_gpu) counts
    the encoder: = GPT(cfg).num_parameters(); the first pipeline stage holds it."""
    cfg = mt.GPTConfig.vlm(vocab_size=256, seq_len=16, n_layer=2, n_head=4, d_model=16,
                           n_kv_head=2, vision_width=24, vision_heads=4)
    assert calc.exact_param_count(cfg) == mt.GPT(cfg).num_parameters()
    text = mt.GPTConfig(**{**vars(cfg), "vision_patches": 0})
    first, last = calc.params_per_stage(cfg, pp=2)
    assert (first, last) == (calc.params_per_stage(text, pp=2)[0] + calc.vision_params(cfg),
                             calc.params_per_stage(text, pp=2)[1])
