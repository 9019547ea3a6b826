"""A vision-language model's encoder on a pipeline stage of its own, over a tensor-parallel
size of its own: the third layout beside `minitp.calc.architectures.vision`'s two. A MODEL;
minitp does not run it (its encoder lives in the decoder's first stage).

Megatron-LM had it as ``--encoder-pipeline-model-parallel-size`` and
``--encoder-tensor-model-parallel-size`` (megatron/training/arguments.py, from commit
8af3dae "Allow Encoder to Have Different TP Size", 2024-08, to their removal in commit
b600e38, 2025-07, for more general heterogeneous layouts): the encoder on epp stages of
its own, before the decoder's pp, over etp ≤ tp ranks; the GPUs then number
dp·etp·epp·cp + dp·tp·pp·cp (docs/source/api-guide/encoder_decoder_parallelism.rst at
b600e38^). One encoder rank sends its output to several decoder ranks and sums the
gradients they send back.

Modelled here with epp = 1, per microbatch of b images, on one of the etp encoder ranks:

* compute and all-reduces: the encoder's "tensor" layout over etp ranks, no sequence
  parallelism (`vision_layout`): its blocks split over etp, 2L all-reduces of b·P·w
  values (frozen: forward only) or 4L (trained); none at etp = 1;
* point-to-point: the image tokens, b·P·d values, sent forward to each of its tp/etp
  decoder ranks of the first decoder stage, and their gradient received back from each
  (the projector trains, frozen encoder or not): tp/etp messages each way, each α + S/β
  over the link spanning the etp + tp ranks (`Cluster.collective_seconds("send")`);
* no gradient sum over etp: each encoder rank receives its output's whole gradient.

The stage works beside the decoder's (1F1B, a microbatch at a time): it paces the whole
pipeline only when its seconds per microbatch exceed a decoder stage's, it takes the
encoder's work out of the first decoder stage, and it costs etp more GPUs a replica and
one more stage (1F1B's bubble (p − 1)/m becomes p/m).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...rules import check_positive_int
from ..network.cluster import Cluster
from .vision import VisionEncoderShape, VisionLayoutCost, vision_layout
from .vision_time import layout_seconds


@dataclass(frozen=True)
class VisionStageCost:
    """`vision_encoder_stage`: one encoder rank's cost per microbatch. ``layout``: its
    params, bytes, FLOPs and memory (`VisionLayoutCost` of "tensor" over etp);
    ``p2p_bytes``: what it sends forward (and receives back) per microbatch, all tp/etp
    messages together; ``gpus``: the GPUs the stage adds to each replica (etp)."""

    etp: int
    tp: int
    frozen: bool
    layout: VisionLayoutCost
    compute_seconds: float
    tp_seconds: float
    p2p_bytes: int
    p2p_seconds: float

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.tp_seconds + self.p2p_seconds

    @property
    def gpus(self) -> int:
        return self.etp


def vision_encoder_stage(shape: VisionEncoderShape, cluster: Cluster, etp: int, tp: int,
                         micro_batch: int, frozen: bool = False, mfu: float = 0.5,
                         bytes_per_value: int = 2,
                         optimizer: str = "adam-mixed") -> VisionStageCost:
    """MODEL: the encoder on a pipeline stage of its own over ``etp`` ranks, feeding a
    decoder tensor-parallel over ``tp`` (etp divides tp, as Megatron-LM allowed no
    encoder wider than its decoder): seconds per microbatch of ``micro_batch`` images —
    compute at ``mfu`` × peak, the etp all-reduces, the sends to and from the decoder's
    first stage (the module docstring) — and the stage's memory per rank."""
    check_positive_int("etp", etp)
    check_positive_int("tp", tp)
    if tp % etp:
        raise ValueError(f"etp={etp} must divide the decoder's tp={tp}: each encoder rank "
                         "feeds tp/etp decoder ranks")
    layout = vision_layout(shape, "tensor", etp, micro_batch, bytes_per_value=bytes_per_value,
                           optimizer=optimizer, frozen=frozen)
    compute, comm = layout_seconds(shape, cluster, "tensor", etp, micro_batch, 1, False, mfu,
                                   bytes_per_value, bytes_per_value, frozen)
    message = micro_batch * shape.patches * shape.d_model * bytes_per_value
    sends = tp // etp
    p2p = 2 * sends * cluster.collective_seconds("send", message, 2, etp + tp)
    return VisionStageCost(etp, tp, frozen, layout, compute, comm, sends * message, p2p)
