"""A vision-language model's encoder over a tensor-parallel group: the seconds per step of
its two layouts (`minitp.calc.architectures.vision`), frozen or trained, and the encoder width
at which they cost the same. Every number here is a MODEL.

Time: FLOPs / (peak · mfu) plus, for every all-reduce of S bytes, the ring's wire bytes
2(t−1)/t·S (`ring_wire_bytes`) over the tp group's bandwidth β and 2(t−1) hops of its
latency α (`Cluster.link(t)`, the α–β model of `Cluster.collective_seconds`); nothing
overlapped. With R = peak · mfu and B bytes per value, "tensor" is faster exactly when
the compute its split saves beats its all-reduces; only the blocks differ:

* trained, no sequence parallelism: (1 − 1/t) of 3 forwards against 4L all-reduces,

      3m(1 − 1/t)·L(24bPw² + 4bP²w)/R  >  4Lm·(2(t−1)/t·bPwB/β + 2(t−1)α)
      ⟺  18w² + (3P − 2RB/β)·w − 2Rtα/(bP) > 0
      ⟺  w > w* = [2RB/β − 3P + √((2RB/β − 3P)² + 144Rtα/(bP))] / 36,

  with α = 0, w* = RB/(9β) − P/6. With sequence parallelism the per-step sum of all n
  gradients ("replicated") and the b·P·d one ("tensor") enter: still a quadratic gap
  with one positive root.
* frozen: (1 − 1/t) of ONE forward against 2L all-reduces (forward only),

      m(1 − 1/t)·L(24bPw² + 4bP²w)/R  >  2Lm·(2(t−1)/t·bPwB/β + 2(t−1)α)
      ⟺  6w² + (P − RB/β)·w − Rtα/(bP) > 0
      ⟺  w > w* = [RB/β − P + √((RB/β − P)² + 24Rtα/(bP))] / 12,

  with α = 0, w* = RB/(6β) − P/6: the split pays off only at wider encoders. Sequence
  parallelism changes nothing: both layouts then sum the same projector gradients.

All free of L and m. "replicated" wins below w*, "tensor" above; `vision_crossover`
bisects T_replicated(w) − T_tensor(w) for the root in every case. The decoder's own
costs are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..network.cluster import Cluster
from ..network.comm import ring_wire_bytes
from .vision import (
    LAYOUTS,
    VisionEncoderShape,
    VisionLayoutCost,
    check_layout,
    layout_cost,
    vision_layout,
)


def all_reduce_seconds(collectives, cluster: Cluster, tp: int) -> float:
    """α–β seconds of [(count, payload bytes)] ring all-reduces over ``tp`` ranks."""
    alpha, beta = cluster.link(tp)
    return float(sum(n * (ring_wire_bytes("all_reduce", s, tp) / beta + 2 * (tp - 1) * alpha)
                     for n, s in collectives))


def layout_seconds(shape, cluster, layout, tp, micro_batch, microbatches, sequence_parallel,
                   mfu, bytes_per_value, grad_bytes, frozen, w=None) -> tuple[float, float]:
    """(compute, communication) seconds: the module docstring's time."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    w = Fraction(shape.width) if w is None else w
    _, flops, collectives = layout_cost(shape, w, layout, tp, micro_batch, microbatches,
                                        sequence_parallel, bytes_per_value, grad_bytes, frozen)
    return float(flops) / (cluster.peak_flops * mfu), all_reduce_seconds(collectives, cluster, tp)


def vision_step_time(shape: VisionEncoderShape, cluster: Cluster, layout: str, tp: int,
                     micro_batch: int, microbatches: int = 1, sequence_parallel: bool = False,
                     mfu: float = 0.5, bytes_per_value: int = 2,
                     grad_bytes: int | None = None, frozen: bool = False) -> float:
    """MODEL: seconds the encoder takes one rank per optimizer step under ``layout``: its
    FLOPs at ``mfu`` × ``cluster.peak_flops`` (0.5 as `step_time`'s ``efficiency``) plus
    its all-reduces' α–β time over the tp group (the module docstring), not overlapped.
    ``frozen``: the encoder's weights frozen, the projector trained (`vision_layout`)."""
    grad_bytes = bytes_per_value if grad_bytes is None else grad_bytes
    check_layout(shape, layout, tp, micro_batch, microbatches, bytes_per_value, grad_bytes)
    return sum(layout_seconds(shape, cluster, layout, tp, micro_batch, microbatches,
                              sequence_parallel, mfu, bytes_per_value, grad_bytes, frozen))


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
    frozen: bool
    costs: dict[str, VisionLayoutCost]
    seconds: dict[str, float]
    compute_seconds: dict[str, float]
    tp_seconds: dict[str, float]
    winner: str
    width: float | None
    below: str
    above: str


def _root(gap, w_max: float) -> float | None:
    """The first w in [1, w_max] where ``gap`` changes sign, by doubling then bisection."""
    lo = 1.0
    while lo < w_max:
        hi = 2 * lo
        if (gap(lo) > 0) != (gap(hi) > 0):
            for _ in range(200):
                mid = (lo + hi) / 2
                if mid in (lo, hi):
                    break
                lo, hi = (mid, hi) if (gap(mid) > 0) == (gap(lo) > 0) else (lo, mid)
            return (lo + hi) / 2
        lo = hi
    return None


def vision_crossover(shape: VisionEncoderShape, cluster: Cluster, tp: int, micro_batch: int,
                     microbatches: int = 1, sequence_parallel: bool = False, mfu: float = 0.5,
                     bytes_per_value: int = 2, grad_bytes: int | None = None,
                     frozen: bool = False, w_max: float = 2.0 ** 20) -> VisionCrossover:
    """MODEL: both layouts of ``shape`` on ``cluster`` over ``tp`` ≥ 2 ranks — their
    `VisionLayoutCost` and seconds per step — and the encoder width w at which their
    `vision_step_time` is equal, the other sizes held (heads too: w is a real number here).
    Found by bisection on T_replicated(w) − T_tensor(w), a quadratic in w with one positive
    root (the module docstring; without sequence parallelism, or frozen, it is w*)."""
    if tp < 2:
        raise ValueError(f"tp={tp}: the two layouts differ only over tp >= 2 ranks")
    grad_bytes = bytes_per_value if grad_bytes is None else grad_bytes
    args = (tp, micro_batch, microbatches, sequence_parallel)
    rest = (mfu, bytes_per_value, grad_bytes, frozen)
    costs, parts = {}, {}
    for layout in LAYOUTS:
        costs[layout] = vision_layout(shape, layout, *args, bytes_per_value, grad_bytes,
                                      frozen=frozen)
        parts[layout] = layout_seconds(shape, cluster, layout, *args, *rest)
    seconds = {k: sum(v) for k, v in parts.items()}

    def gap(w: float) -> float:  # > 0: "tensor" faster
        return (sum(layout_seconds(shape, cluster, "replicated", *args, *rest, w))
                - sum(layout_seconds(shape, cluster, "tensor", *args, *rest, w)))

    def faster(g: float) -> str:
        return "tensor" if g > 0 else "replicated"

    width = _root(gap, w_max)
    below = faster(gap(width / 2 if width else 1.0))
    above = faster(gap(width * 2)) if width else below
    return VisionCrossover(shape.name, *args, frozen, costs, seconds,
                           {k: v[0] for k, v in parts.items()}, {k: v[1] for k, v in parts.items()},
                           faster(seconds["replicated"] - seconds["tensor"]), width, below, above)

