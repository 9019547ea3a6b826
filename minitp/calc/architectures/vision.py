"""A vision-language model's encoder over a tensor-parallel group: parameters, bytes,
FLOPs and memory per rank of its two layouts, with the encoder FROZEN or TRAINED. Every
number here is a MODEL. (Time and the crossover width: `minitp.calc.architectures.vision_time`; the
encoder on a pipeline stage of its own: `minitp.calc.architectures.vision_stage`.)

The encoder (`minitp.model.vision`): a patch embedding Linear(8 → w) with bias, learned
positions (P × w), L GPT-2 blocks w wide (pre-LayerNorm, biases, fused qkv, GELU MLP 4w
wide, attention not causal), a final LayerNorm and a projector Linear(w → d) with bias
into the decoder's width d; its P outputs come before the text of a tensor-parallel
decoder. Two layouts over t ranks (`minitp.tensor_parallel.vision` runs both, trained):

* "replicated": every rank holds and runs the whole encoder on all P patches of its b
  images. Without sequence parallelism nothing is sent (the output's gradient arrives
  whole on every rank). With it each rank places only its slice of the sequence, so the
  gradients it computes are partial: ONE all-reduce over tp per optimizer step of all of
  them, whatever the number m of microbatches.
* "tensor": the blocks split as Megatron-LM splits a layer (qkv and fc by columns, the
  two proj by rows; no sequence parallelism inside); patch embedding, positions,
  LayerNorms and projector whole. Per microbatch and layer 2 all-reduces forward of
  b·P·w values, and 2 backward when the encoder trains.

``frozen``: whether the encoder's weights are frozen, the projector alone trained beside
the decoder, as LLaVA trains (Liu et al. 2023, "Visual Instruction Tuning", arXiv
2304.08485, §4.2: the visual encoder's weights stay frozen in both stages; LLaVA-1.5,
arXiv 2310.03744, is trained by the same code, whose vision tower runs under torch.no_grad
with requires_grad_(False): haotian-liu/LLaVA, llava/model/multimodal_encoder/clip_encoder.py;
Megatron-LM's LLaVA-style scripts pass --freeze-ViT,
examples/multimodal/pretrain_mistral_clip.sh). Trained, as Qwen2-VL's second stage unfreezes
every parameter (Wang et al. 2024, arXiv 2409.12191, §2.2) — and shards its vision encoder
over TP with the LLM (§2.3, "Parallelism"), the "tensor" layout here.

* trained: backward twice the forward (3× in all, Korthikanti et al. 2022, Eq. 7; the
  patch embedding's input gradient counted though the pixels need none). Under sequence
  parallelism "replicated" sums all n parameters' gradients once a step; "tensor" sums
  the image tokens' gradient, b·P·d values, once per microbatch (its output is copied
  to every rank before each takes its slice: the split blocks need the whole gradient).
* frozen: the pixels and the encoder need no gradient, so no backward runs through the
  encoder: the one backward product is the projector's weight gradient, 2bPwd FLOPs a
  microbatch, and the only gradients are the projector's wd + d. Under sequence
  parallelism a rank's are partial in BOTH layouts (it holds its slice's gradient of a
  whole projector): one all-reduce of (wd + d) per step each, and no b·P·d all-reduce
  ("tensor"'s blocks need no gradient). The frozen encoder holds its weights only
  (``bytes_per_value`` each), and keeps no activation but the projector's input, b·P·w.

Parameters: n = L(12w² + 13w) + (9 + P + 2)w + wd + d — per block qkv 3w² + 3w, proj w² + w,
fc 4w² + 4w, proj 4w² + w, two LayerNorms 4w; patches 9w, positions Pw, final LN 2w,
projector wd + d. Under "tensor" a rank holds L(12w² + 7w)/t + 6Lw + the rest (as
`minitp.calc.counts.params.layer_params_per_rank`: the row-parallel biases and LayerNorms whole).

Forward FLOPs (2 per multiply-add) per microbatch: L(24bPw² + 4bP²w) for the blocks'
matrices and QKᵀ, ·V (whole P², not causal), 16bPw the patches, 2bPwd the projector; the
blocks' term divided by t under "tensor". The decoder's own costs are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace

from ...rules import PATCH_H, PATCH_W, check_positive_int
from .._util import number
from ..counts.params import encoder_params
from ..footprint.memory import activation_bytes_per_layer, model_state_bytes

LAYOUTS = ("replicated", "tensor")
# minitp's patch: one byte of binary pixels (`minitp.model.vision`)
PATCH_PIXELS = PATCH_W * PATCH_H


@dataclass(frozen=True)
class VisionEncoderShape:
    """A vision encoder as minitp builds it: ``layers`` blocks ``width`` wide of ``heads``
    heads, ``patches`` positions, projected into the decoder's width ``d_model``."""

    name: str
    layers: int
    width: int
    heads: int
    patches: int
    d_model: int
    source: str = ""

    @classmethod
    def of(cls, cfg) -> VisionEncoderShape:
        """The encoder of a vision-language `minitp.GPTConfig` (``GPTConfig.vlm``)."""
        return cls("minitp VLM", cfg.vision_layers, cfg.vision_width, cfg.vision_heads,
                   cfg.vision_patches, cfg.d_model, "minitp.GPTConfig")


# LLaVA-1.5-13B's vision tower into its decoder. A MODEL of it with minitp's parts: CLIP's ViT
# has a class token (P + 1 positions; LLaVA drops its output and reads the penultimate
# layer), a 3×14×14 convolution as patch embedding and a LayerNorm before the blocks, and
# LLaVA-1.5's projector is a 2-layer MLP (w → d → d, GELU). Counted here is minitp's encoder
# at these sizes: a Linear(8 → w) patch embedding, P positions, a linear projector.
LLAVA15_VISION = VisionEncoderShape(
    "LLaVA-1.5-13B's encoder (CLIP ViT-L/14, 336 px)", layers=24, width=1024, heads=16,
    patches=(336 // 14) ** 2, d_model=5120,
    source="Radford et al. 2021, 'Learning Transferable Visual Models From Natural Language "
           "Supervision' (arXiv 2103.00020), Table 20: ViT-L/14, 24 layers, width 1024, 16 "
           "heads (MLP 4 x 1024 = 4096); ViT-L/14@336px the same at 336 px, (336/14)^2 = 576 "
           "patches. Liu et al. 2023, 'Improved Baselines with Visual Instruction Tuning' "
           "(LLaVA-1.5, arXiv 2310.03744): CLIP-ViT-L-336px into Vicuna-13B (d_model 5120, "
           "LLaMA-13B's dimension) through a two-layer MLP projector.")


@dataclass(frozen=True)
class VisionLayoutCost:
    """One layout of the encoder on one tp rank, per optimizer step of ``microbatches``
    microbatches. ``params``: those the rank holds; ``trainable``: those of them that
    train (all, or the projector's when ``frozen``). ``tp_bytes_per_step``: the
    all-reduces' payload (the whole tensors; the ring sends 2(t−1)/t of it,
    `ring_wire_bytes`). ``model_state_bytes``: the trainable parameters' weights,
    gradients and Adam state (`model_state_bytes`, 16 bytes each in "adam-mixed") and the
    frozen ones' weights; ``activation_bytes``: one microbatch's kept for backward, no
    recomputation (trained: `activation_bytes_per_layer`, Korthikanti et al. 2022 Table 2,
    t = 1 for "replicated"; frozen: the projector's input)."""

    layout: str
    tp: int
    frozen: bool
    params: int
    trainable: int
    tp_bytes_per_step: int | float
    tp_collectives_per_step: int
    flops_per_step: int | float
    model_state_bytes: int | float
    activation_bytes: int | float

    @property
    def memory_bytes(self) -> int | float:
        return number(Fraction(self.model_state_bytes) + Fraction(self.activation_bytes))


def vision_encoder_params(shape: VisionEncoderShape) -> int:
    """Parameters of the whole encoder, projector included (the module docstring's n)."""
    _check_shape(shape)
    return number(encoder_params(shape.layers, Fraction(shape.width), shape.patches,
                                 shape.d_model))


def projector_params(shape: VisionEncoderShape) -> int:
    """The projector's wd + d: all that trains when the encoder is frozen."""
    return shape.width * shape.d_model + shape.d_model


def _check_shape(shape) -> None:
    for name in ("layers", "width", "heads", "patches", "d_model"):
        check_positive_int(f"{type(shape).__name__}.{name}", getattr(shape, name))
    if shape.width % shape.heads:
        raise ValueError(f"width={shape.width} is not divisible by heads={shape.heads}")


def check_layout(shape, layout, tp, micro_batch, microbatches, bytes_per_value,
                 grad_bytes) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'replicated' or 'tensor', got {layout!r}")
    _check_shape(shape)
    for name, value in (("tp", tp), ("micro_batch", micro_batch), ("microbatches", microbatches),
                        ("bytes_per_value", bytes_per_value), ("grad_bytes", grad_bytes)):
        check_positive_int(name, value)
    if layout == "tensor" and shape.heads % tp:
        raise ValueError(f"layout='tensor' splits the encoder's heads: tp={tp} does not divide "
                         f"heads={shape.heads}")


def forward_flops(shape, w, b, split=1):
    """One microbatch's forward over ``b`` images at width ``w``, the blocks over ``split``."""
    L, P, d = shape.layers, shape.patches, shape.d_model
    return (L * (24 * b * P * w * w + 4 * b * P * P * w) / split
            + 2 * b * P * w * (PATCH_PIXELS + d))


def layout_cost(shape, w, layout, t, b, m, sp, bpv, gb, frozen=False):
    """(params, FLOPs per step, [(count, payload bytes)] of the all-reduces) at width ``w``:
    a Fraction for the exact values, a float for `vision_crossover`'s search."""
    L, P, d = shape.layers, shape.patches, shape.d_model
    split = t if layout == "tensor" else 1
    params = encoder_params(L, w, P, d, split)
    forward = forward_flops(shape, w, b, split)
    # frozen: no backward through the encoder, only the projector's weight gradient
    flops = m * (forward + 2 * b * P * w * d) if frozen else 3 * m * forward
    projector_sum = [(1, (w * d + d) * gb)] if sp else []  # a whole projector's partial grads
    if t == 1:
        collectives = []
    elif layout == "tensor":
        collectives = ([(2 * L * m, b * P * w * bpv)] + projector_sum if frozen else
                       [(4 * L * m, b * P * w * bpv)] + ([(m, b * P * d * bpv)] if sp else []))
    else:
        collectives = projector_sum if frozen else ([(1, params * gb)] if sp else [])
    return params, flops, collectives


def vision_forward_flops(cfg, images: int) -> int:
    """Matrix FLOPs of a vision-language `GPTConfig`'s encoder forward over `images` images
    (0 for a text model): `vision_layout`'s count on one rank; `flops_per_iteration` adds
    3× it (minitp trains the encoder, and never recomputes it)."""
    if not getattr(cfg, "vision_patches", 0):
        return 0
    return int(forward_flops(VisionEncoderShape.of(cfg), Fraction(cfg.vision_width), images))


def vision_layout(shape: VisionEncoderShape, layout: str, tp: int, micro_batch: int,
                  microbatches: int = 1, sequence_parallel: bool = False,
                  bytes_per_value: int = 2, grad_bytes: int | None = None,
                  optimizer: str = "adam-mixed", frozen: bool = False) -> VisionLayoutCost:
    """MODEL: what ``layout`` ("replicated" or "tensor", the module docstring) costs one of
    ``tp`` ranks per optimizer step: ``microbatches`` microbatches of ``micro_batch``
    images; ``sequence_parallel``: the decoder's; ``frozen``: the encoder's weights frozen,
    the projector trained. ``grad_bytes``: the gradients' bytes per value (default
    ``bytes_per_value``). With tp = 1 the two are one and send nothing."""
    grad_bytes = bytes_per_value if grad_bytes is None else grad_bytes
    check_layout(shape, layout, tp, micro_batch, microbatches, bytes_per_value, grad_bytes)
    params, flops, collectives = layout_cost(shape, Fraction(shape.width), layout, tp,
                                             micro_batch, microbatches, sequence_parallel,
                                             bytes_per_value, grad_bytes, frozen)
    params = number(params)
    if frozen:
        trainable = projector_params(shape)
        states = (model_state_bytes(trainable, optimizer=optimizer)["total"]
                  + (params - trainable) * bytes_per_value)
        activations = micro_batch * shape.patches * shape.width * bytes_per_value
    else:
        trainable, states = params, model_state_bytes(params, optimizer=optimizer)["total"]
        blocks = SimpleNamespace(seq_len=shape.patches, d_model=shape.width, n_head=shape.heads)
        per_layer = activation_bytes_per_layer(blocks, micro_batch,
                                               tp if layout == "tensor" else 1)
        activations = number(shape.layers * Fraction(per_layer))
    return VisionLayoutCost(
        layout, tp, frozen, params, trainable,
        number(sum(n * Fraction(s) for n, s in collectives)),
        sum(n for n, _ in collectives), number(flops), states, activations)
