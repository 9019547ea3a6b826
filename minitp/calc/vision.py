"""A vision-language model's encoder over a tensor-parallel group: parameters, bytes,
FLOPs, memory and time per rank of its two layouts, and the encoder width where they
cost the same. Every number here is a MODEL.

The encoder (`minitp.model.vision`): a patch embedding Linear(8 → w) with bias, learned
positions (P × w), L GPT-2 blocks w wide (pre-LayerNorm, biases, fused qkv, GELU MLP 4w
wide, attention not causal), a final LayerNorm and a projector Linear(w → d) with bias
into the decoder's width d; its P outputs come before the text of a tensor-parallel
decoder. The layouts over t ranks (the course's source, the Megatron-LM tensor-parallelism
write-up, §5 "Multi-GPU VLM training"; `minitp.tensor_parallel.vision` runs both):

* "replicated": every rank holds and runs the whole encoder on all P patches of its b
  images. Without sequence parallelism nothing is sent (the output's gradient arrives
  whole on every rank). With it each rank places only its slice of the sequence, so its
  encoder gradients are partial: ONE all-reduce over tp per optimizer step of all of them,
  n_encoder·grad_bytes, whatever the number m of microbatches.
* "tensor": the blocks split as Megatron-LM splits a layer (qkv and fc by columns, the
  two proj by rows; no sequence parallelism inside); patch embedding, positions,
  LayerNorms and projector whole. Per microbatch and layer 2 all-reduces forward and 2
  backward of b·P·w values; with sequence parallelism in the decoder, one more per
  microbatch, backward, of the image tokens' gradient, b·P·d values (the projector's
  output is copied to every rank before each takes its slice).

Parameters: n = L(12w² + 13w) + (9 + P + 2)w + wd + d — per block qkv 3w² + 3w, proj w² + w,
fc 4w² + 4w, proj 4w² + w, two LayerNorms 4w; patches 9w, positions Pw, final LN 2w,
projector wd + d. Under "tensor" a rank holds L(12w² + 7w)/t + 6Lw + the rest (as
`minitp.calc.params.layer_params_per_rank`: the row-parallel biases and LayerNorms whole).

FLOPs (2 per multiply-add, backward twice the forward: 3× in all, as Korthikanti et al.
2022, Eq. 7; the patch embedding's backward needs no input gradient, counted anyway) per
microbatch forward: L(24bPw² + 4bP²w) for the blocks' matrices and QKᵀ, ·V (whole P², not
causal), 16bPw the patches, 2bPwd the projector; the blocks' term divided by t under "tensor".

Time: FLOPs / (peak · mfu) plus, for every all-reduce of S bytes, the ring's wire bytes
2(t−1)/t·S (`ring_wire_bytes`) over the tp group's bandwidth β and 2(t−1) hops of its
latency α (`Cluster.link(t)`, the α–β model of `Cluster.collective_seconds`); nothing
overlapped. Without sequence parallelism only the blocks differ (R = peak · mfu, B bytes
per value), so "tensor" is faster exactly when its compute saving beats its 4Lm all-reduces:

    3m(1 − 1/t)·L(24bPw² + 4bP²w)/R  >  4Lm·(2(t−1)/t·bPwB/β + 2(t−1)α)
    ⟺  18w² + (3P − 2RB/β)·w − 2Rtα/(bP) > 0
    ⟺  w > w* = [2RB/β − 3P + √((2RB/β − 3P)² + 144Rtα/(bP))] / 36,

free of L and m; with α = 0, w* = RB/(9β) − P/6. "replicated" wins below w*, "tensor"
above. With sequence parallelism the per-step all-reduce of 12Lw² + … gradients and the
b·P·d one enter: the gap is still a quadratic in w with one positive root
(`vision_crossover` bisects for it). The decoder's own costs are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace

from ..rules import PATCH_H, PATCH_W, check_positive_int
from ._util import number
from .cluster import Cluster
from .comm import ring_wire_bytes
from .memory import activation_bytes_per_layer, model_state_bytes
from .params import encoder_params

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
    microbatches. ``tp_bytes_per_step``: the all-reduces' payload (the whole tensors; the
    ring sends 2(t−1)/t of it, `ring_wire_bytes`). ``model_state_bytes``: parameters,
    gradients and Adam state (`model_state_bytes`, 16 bytes each in "adam-mixed");
    ``activation_bytes``: one microbatch's, no recomputation (`activation_bytes_per_layer`,
    Korthikanti et al. 2022 Table 2, t = 1 for "replicated")."""

    layout: str
    tp: int
    params: int
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
    return number(_cost(shape, Fraction(shape.width), "replicated", 1, 1, 1, False, 2, 2)[0])


def _check_shape(shape) -> None:
    for name in ("layers", "width", "heads", "patches", "d_model"):
        check_positive_int(f"{type(shape).__name__}.{name}", getattr(shape, name))
    if shape.width % shape.heads:
        raise ValueError(f"width={shape.width} is not divisible by heads={shape.heads}")


def _check(shape, layout, tp, micro_batch, microbatches, bytes_per_value, grad_bytes) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'replicated' or 'tensor', got {layout!r}")
    _check_shape(shape)
    for name, value in (("tp", tp), ("micro_batch", micro_batch), ("microbatches", microbatches),
                        ("bytes_per_value", bytes_per_value), ("grad_bytes", grad_bytes)):
        check_positive_int(name, value)
    if layout == "tensor" and shape.heads % tp:
        raise ValueError(f"layout='tensor' splits the encoder's heads: tp={tp} does not divide "
                         f"heads={shape.heads}")


def _cost(shape, w, layout, t, b, m, sp, bpv, gb):
    """(params, FLOPs per step, [(count, payload bytes)] of the all-reduces) at width ``w``:
    a Fraction for the exact values, a float for `vision_crossover`'s search."""
    L, P, d = shape.layers, shape.patches, shape.d_model
    split = t if layout == "tensor" else 1
    params = encoder_params(L, w, P, d, split)
    forward = L * (24 * b * P * w * w + 4 * b * P * P * w) / split + 2 * b * P * w * (
        PATCH_PIXELS + d)
    if t == 1:
        collectives = []
    elif layout == "tensor":
        collectives = [(4 * L * m, b * P * w * bpv)] + ([(m, b * P * d * bpv)] if sp else [])
    else:
        collectives = [(1, params * gb)] if sp else []
    return params, 3 * m * forward, collectives


def vision_forward_flops(cfg, images: int) -> int:
    """Matrix FLOPs of a vision-language `GPTConfig`'s encoder forward over `images` images
    (0 for a text model): `vision_layout`'s count on one rank; `flops_per_iteration` adds
    3× it (the encoder is never recomputed)."""
    if not getattr(cfg, "vision_patches", 0):
        return 0
    shape = VisionEncoderShape.of(cfg)
    return int(_cost(shape, shape.width, "replicated", 1, images, 1, False, 2, 2)[1]) // 3


def vision_layout(shape: VisionEncoderShape, layout: str, tp: int, micro_batch: int,
                  microbatches: int = 1, sequence_parallel: bool = False,
                  bytes_per_value: int = 2, grad_bytes: int | None = None,
                  optimizer: str = "adam-mixed") -> VisionLayoutCost:
    """MODEL: what ``layout`` ("replicated" or "tensor", the module docstring) costs one of
    ``tp`` ranks per optimizer step: ``microbatches`` microbatches of ``micro_batch``
    images; ``sequence_parallel``: the decoder's. ``grad_bytes``: the gradients' bytes per
    value (default ``bytes_per_value``). With tp = 1 the two are one and send nothing."""
    grad_bytes = bytes_per_value if grad_bytes is None else grad_bytes
    _check(shape, layout, tp, micro_batch, microbatches, bytes_per_value, grad_bytes)
    params, flops, collectives = _cost(shape, Fraction(shape.width), layout, tp, micro_batch,
                                       microbatches, sequence_parallel, bytes_per_value,
                                       grad_bytes)
    params = number(params)
    blocks = SimpleNamespace(seq_len=shape.patches, d_model=shape.width, n_head=shape.heads)
    per_layer = activation_bytes_per_layer(blocks, micro_batch, tp if layout == "tensor" else 1)
    return VisionLayoutCost(
        layout, tp, params, number(sum(n * Fraction(s) for n, s in collectives)),
        sum(n for n, _ in collectives), number(flops),
        model_state_bytes(params, optimizer=optimizer)["total"],
        number(shape.layers * Fraction(per_layer)))


def _seconds(flops, collectives, cluster: Cluster, tp: int, mfu: float) -> tuple[float, float]:
    """(compute, communication) seconds: the module docstring's time."""
    alpha, beta = cluster.link(tp)
    comm = sum(n * (ring_wire_bytes("all_reduce", s, tp) / beta + 2 * (tp - 1) * alpha)
               for n, s in collectives)
    return float(flops) / (cluster.peak_flops * mfu), float(comm)


def _times(shape, cluster, layout, tp, micro_batch, microbatches, sequence_parallel, mfu,
           bytes_per_value, grad_bytes, w=None):
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    w = Fraction(shape.width) if w is None else w
    _, flops, collectives = _cost(shape, w, layout, tp, micro_batch, microbatches,
                                  sequence_parallel, bytes_per_value, grad_bytes)
    return _seconds(flops, collectives, cluster, tp, mfu)


def vision_step_time(shape: VisionEncoderShape, cluster: Cluster, layout: str, tp: int,
                     micro_batch: int, microbatches: int = 1, sequence_parallel: bool = False,
                     mfu: float = 0.5, bytes_per_value: int = 2,
                     grad_bytes: int | None = None) -> float:
    """MODEL: seconds the encoder takes one rank per optimizer step under ``layout``: its
    FLOPs at ``mfu`` × ``cluster.peak_flops`` (0.5 as `step_time`'s ``efficiency``) plus
    its all-reduces' α–β time over the tp group (the module docstring), not overlapped."""
    grad_bytes = bytes_per_value if grad_bytes is None else grad_bytes
    _check(shape, layout, tp, micro_batch, microbatches, bytes_per_value, grad_bytes)
    return sum(_times(shape, cluster, layout, tp, micro_batch, microbatches, sequence_parallel,
                      mfu, bytes_per_value, grad_bytes))


@dataclass(frozen=True)
class VisionCrossover:
    """`vision_crossover`'s comparison. ``seconds``, ``compute_seconds`` and ``tp_seconds``
    by layout; ``winner``: the faster at the shape's width; ``width``: where the two cost
    the same (None: no crossing up to ``w_max``), ``below``/``above``: who wins there."""

    shape: str
    tp: int
    micro_batch: int
    microbatches: int
    sequence_parallel: bool
    costs: dict[str, VisionLayoutCost]
    seconds: dict[str, float]
    compute_seconds: dict[str, float]
    tp_seconds: dict[str, float]
    winner: str
    width: float | None
    below: str
    above: str


def vision_crossover(shape: VisionEncoderShape, cluster: Cluster, tp: int, micro_batch: int,
                     microbatches: int = 1, sequence_parallel: bool = False, mfu: float = 0.5,
                     bytes_per_value: int = 2, grad_bytes: int | None = None,
                     w_max: float = 2.0 ** 20) -> VisionCrossover:
    """MODEL: both layouts of ``shape`` on ``cluster`` over ``tp`` ≥ 2 ranks — their
    `VisionLayoutCost` and seconds per step — and the encoder width w at which their
    `vision_step_time` is equal, the other sizes held (heads too: w is a real number here).
    Found by bisection on T_replicated(w) − T_tensor(w), a quadratic in w with one positive
    root (the module docstring; without sequence parallelism it is w*)."""
    if tp < 2:
        raise ValueError(f"tp={tp}: the two layouts differ only over tp >= 2 ranks")
    grad_bytes = bytes_per_value if grad_bytes is None else grad_bytes
    args = (tp, micro_batch, microbatches, sequence_parallel)
    costs, parts = {}, {}
    for layout in LAYOUTS:
        costs[layout] = vision_layout(shape, layout, *args, bytes_per_value, grad_bytes)
        parts[layout] = _times(shape, cluster, layout, *args, mfu, bytes_per_value, grad_bytes)
    seconds = {k: sum(v) for k, v in parts.items()}

    def gap(w: float) -> float:  # > 0: "tensor" faster
        return (sum(_times(shape, cluster, "replicated", *args, mfu, bytes_per_value,
                           grad_bytes, w))
                - sum(_times(shape, cluster, "tensor", *args, mfu, bytes_per_value,
                             grad_bytes, w)))

    def faster(g: float) -> str:
        return "tensor" if g > 0 else "replicated"

    lo, width = 1.0, None
    while lo < w_max and width is None:
        hi = 2 * lo
        if (gap(lo) > 0) != (gap(hi) > 0):
            for _ in range(200):
                mid = (lo + hi) / 2
                if mid in (lo, hi):
                    break
                lo, hi = (mid, hi) if (gap(mid) > 0) == (gap(lo) > 0) else (lo, mid)
            width = (lo + hi) / 2
        else:
            lo = hi
    below = faster(gap(width / 2 if width else 1.0))
    above = faster(gap(width * 2)) if width else below
    return VisionCrossover(shape.name, *args, costs, seconds,
                           {k: v[0] for k, v in parts.items()}, {k: v[1] for k, v in parts.items()},
                           faster(seconds["replicated"] - seconds["tensor"]), width, below, above)
