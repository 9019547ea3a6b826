"""A MODEL of what overlapping tensor-parallel communication saves
(`minitp.tensor_parallel.overlap`).

One transformer layer under tensor + sequence parallelism (t ranks, no
recomputation) runs 8 ring collectives per microbatch, each of t−1 steps that
move one (b, s/t, h) chunk: the all-gathers before the QKV and FC GEMMs and the
reduce-scatters after the attention and MLP output GEMMs, forward; their
conjugates around the data-gradient GEMMs, backward. Without overlap they sit
on the critical path: (t−1)·c per collective, with c = α + (b·s·h·bytes/t)/β the
time of one hop.

Overlapped (the collective matmul), the paired GEMM is cut into t chunks of g
seconds each. The ring starts on the chunk a rank already holds, so each of the
t−1 hops runs beside one chunk's GEMM: a collective plus its GEMM takes
(t−1)·max(c, g) + g instead of (t−1)·c + t·g, and the exposed communication
falls from (t−1)·c to (t−1)·max(0, c − g). Schemes whose first chunk must
arrive before any GEMM can start (e.g. async all-gathers of chunks none of which
is local) pay one hop more, c, unhidden: ``first_hop_exposed=True``.

The plain baseline need not expose all 8. Megatron-LM without userbuffers already hides
2 of them in backward: with sequence parallelism, a column-parallel layer's backward
(`LinearWithGradAccumulationAndAsyncCommunication.backward`,
`megatron/core/tensor_parallel/layers.py`) launches the reduce-scatter of its input
gradient asynchronously and computes its weight gradient meanwhile, so the QKV and FC
layers' backward reduce-scatters run beside a GEMM (t chunk GEMMs long, far longer than
the collective for any layer worth splitting); the row-parallel layers' backward
all-gathers and all 4 forward collectives wait. ``plain_overlapped`` is how many of the
8 the baseline hides entirely: 0 (everything exposed) or ``MEGATRON_PLAIN_OVERLAPPED``.
The overlapped side is the same either way.

Assumed, and not modelled: GEMMs run at ``gemm_efficiency`` × peak whatever the
chunk size (small chunks run slower); a transfer does not slow the GEMM beside
it (on GPUs NCCL's kernels take SMs away from it); the attention core
(softmax(QKᵀ)V, 4bs²h FLOPs forward) and the weight-gradient GEMMs hide
nothing. The layer's time is its FLOPs at that efficiency plus the exposed
communication.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .cluster import Cluster

# The four GEMMs of a layer and their weights' shape (in features, out features)
# in units of h, each paired with one collective (its input all-gather or its output
# reduce-scatter) forward and the conjugate one backward.
LAYER_GEMMS = {"qkv": (1, 3), "attn.proj": (1, 1), "mlp.fc": (1, 4), "mlp.proj": (4, 1)}
# Collectives (of the 8) that Megatron-LM's plain TP + SP already overlaps: the backward
# reduce-scatters of the QKV and FC input gradients, each beside its weight-gradient GEMM
# (megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication).
MEGATRON_PLAIN_OVERLAPPED = 2
COLLECTIVES_PER_LAYER = 2 * len(LAYER_GEMMS)  # 4 forward, 4 backward


@dataclass(frozen=True)
class OverlapModel:
    """Seconds per layer per microbatch (forward + backward) on one rank: a model."""

    compute: float  # every FLOP of the layer at gemm_efficiency × peak
    comm_exposed_plain: float  # the 8 collectives less the plain baseline's overlapped ones
    comm_exposed_overlap: float  # what stays exposed when each hop runs beside a GEMM chunk
    hop: float  # c: one ring hop, α + chunk bytes / β
    smallest_chunk_gemm: float  # g of the smallest GEMM (attention output), one chunk

    @property
    def time_plain(self) -> float:
        return self.compute + self.comm_exposed_plain

    @property
    def time_overlap(self) -> float:
        return self.compute + self.comm_exposed_overlap

    @property
    def saving(self) -> float:
        """The fraction of the layer's (non-overlapped) time that overlapping saves."""
        return 1 - self.time_overlap / self.time_plain

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "time_plain": self.time_plain,
                "time_overlap": self.time_overlap, "saving": self.saving}


def tp_overlap_model(h: int, s: int, t: int, cluster: Cluster, micro_batch: int = 1,
                     bytes_per_value: int = 2, gemm_efficiency: float = 1.0,
                     first_hop_exposed: bool = False,
                     plain_overlapped: int = 0) -> OverlapModel:
    """Model one layer (hidden size `h`, sequence `s`) on `t` tensor-parallel ranks
    of `cluster` (its intra-node link: α, β per direction; its peak FLOP/s).
    `plain_overlapped`: how many of the layer's 8 collectives the plain baseline already
    hides (0: none; Megatron-LM: `MEGATRON_PLAIN_OVERLAPPED`)."""
    if t < 2 or s % t:
        raise ValueError(f"overlap needs t >= 2 dividing s; got t={t}, s={s}")
    if not 0 <= plain_overlapped <= COLLECTIVES_PER_LAYER:
        raise ValueError(f"plain_overlapped must be in 0..{COLLECTIVES_PER_LAYER}, "
                         f"got {plain_overlapped}")
    if not 0 < gemm_efficiency <= 1:
        raise ValueError(f"gemm_efficiency must be in (0, 1], got {gemm_efficiency}")
    b = micro_batch
    alpha, beta = cluster.link(t)
    rate = cluster.peak_flops * gemm_efficiency
    hop = alpha + b * (s // t) * h * bytes_per_value / beta
    plain = (COLLECTIVES_PER_LAYER - plain_overlapped) * (t - 1) * hop
    exposed = 0.0
    chunk_gemms = []
    for d_in, d_out in LAYER_GEMMS.values():
        # one chunk: (b·s/t) tokens through this rank's 1/t of the weight
        g = 2 * b * (s // t) * (d_in * h) * (d_out * h) / t / rate
        chunk_gemms.append(g)
        per_collective = (t - 1) * max(0.0, hop - g) + (hop if first_hop_exposed else 0.0)
        exposed += 2 * per_collective
    # 24bsh² + 4bs²h forward per layer (Narayanan et al. 2021), twice that backward
    flops = 3 * (24 * b * s * h * h + 4 * b * s * s * h) / t
    return OverlapModel(compute=flops / rate, comm_exposed_plain=plain,
                        comm_exposed_overlap=exposed, hop=hop,
                        smallest_chunk_gemm=min(chunk_gemms))
