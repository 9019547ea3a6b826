"""A small all-reduce inside one node, priced two ways (a MODEL: the cluster's α–β, not a
measured kernel). Decode's all-reduces carry B·h values, kilobytes: their latency, not
their bytes, decides what more tensor parallelism costs.

* ``"ring"`` (NCCL's ring, as `Cluster.collective_seconds` prices every collective):
  2(t−1) steps, each paying the hop latency α and carrying S/t bytes:
  2(t−1)·α + 2(t−1)/t · S/β. Its latency grows with t.
* ``"one_shot"``: vLLM's custom all-reduce for small messages (vllm-project/vllm PR #2192;
  ``csrc/custom_all_reduce.cuh`` at 036bb68, ``cross_device_reduce_1stage``). Each GPU
  writes a start flag into every peer's memory at once ("Latency = 1 p2p write", the
  kernel's comment), reads every peer's whole buffer over NVLink and sums it itself, then
  writes an end flag the same way. Priced as one α, the same for every t (the flags go to
  all peers in parallel; counting the end flag as a second α moves the constant, not the
  shape), plus (t−1)·S/β: it reads t/2 times the ring's bytes and buys a latency that does
  not grow with t.

vLLM picks the one-shot kernel at t = 2 always, and with every GPU on NVLink below 512 KiB
at t ≤ 4 or 256 KiB at t ≤ 8 (``CustomAllreduce::allreduce``); above those sizes a two-stage
kernel (reduce-scatter, then all-gather, through the same buffers). vLLM's Python side
(``vllm/distributed/device_communicators/custom_all_reduce.py``, ``CustomAllreduce``) uses
the custom kernels only inside one node, at 2, 4, 6 or 8 GPUs, below 8 MiB
(``should_custom_ar``); NCCL otherwise. So the one-shot price is refused for t beyond a node.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Cluster

__all__ = ["ALLREDUCE_ALGORITHMS", "AllReduceTime", "allreduce_time"]

ALLREDUCE_ALGORITHMS = ("ring", "one_shot")


@dataclass(frozen=True)
class AllReduceTime:
    """One all-reduce of ``nbytes`` over ``n`` GPUs, a MODEL (seconds): the hops' latency
    and the bytes' transfer, apart."""

    algorithm: str
    n: int
    nbytes: float
    latency_seconds: float
    transfer_seconds: float

    @property
    def seconds(self) -> float:
        return self.latency_seconds + self.transfer_seconds


def allreduce_time(cluster: Cluster, nbytes: float, n: int,
                   algorithm: str = "ring") -> AllReduceTime:
    """The modelled time of one all-reduce of ``nbytes`` bytes over ``n`` GPUs by
    ``algorithm`` (``"ring"`` or ``"one_shot"``; see the module docstring)."""
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if algorithm == "one_shot" and n > cluster.gpus_per_node:
        raise ValueError(f"a one-shot all-reduce runs inside one node: n={n} spans more than "
                         f"{cluster.name}'s {cluster.gpus_per_node} GPUs")
    if n == 1:
        return AllReduceTime(algorithm, n, nbytes, 0.0, 0.0)
    alpha, beta = cluster.link(n)
    if algorithm == "ring":
        steps = 2 * (n - 1)
        return AllReduceTime(algorithm, n, nbytes, steps * alpha, steps * nbytes / n / beta)
    return AllReduceTime(algorithm, n, nbytes, alpha, (n - 1) * nbytes / beta)
