"""What a refit costs on a real cluster: a trained model's weights moved from its training
layout onto serving GPUs between two RL steps (`minitp.serving.refit` on a course model;
lesson 19). A MODEL: bytes at the cluster's link bandwidths (`cluster`'s sourced NVLink and
InfiniBand figures, per GPU each way), one hop of latency, no measured kernel.

The layout it prices, Megatron's usual placement: the trainer's tensor-parallel group fills
one node (tp = GPUs per node) and each pipeline stage is a node of its own; each of dp
replicas is pp nodes. A serving replica is one node at the same tp (so a serving GPU's
slice of every layer is the slice the training GPUs of its tp index hold, stage by stage):

* **planned** (what `refit` does): a serving GPU receives its own slice, N·w/t bytes, once;
  the pieces it already holds stay put. Collocated (the trainer's nodes serve, each one a
  replica), a GPU holds its own stage's share, 1/pp of what it needs: the rest crosses
  InfiniBand from the other stages' nodes. Separate (serving nodes of their own), all of
  it crosses. The trainer's dp replicas share the sending: a training GPU sends its shard
  ⌈replicas / dp⌉ times (collocated: pp − 1 times, the dp·(pp − 1) nodes of the other
  stages each needing it once from one of its dp holders). The time is the larger of what
  one GPU receives and what one GPU sends, at its own NIC's bandwidth.
* **naive broadcast** (what an RL loop does first): the dense model gathered to one GPU
  (every byte through that GPU's one NIC), then broadcast to every serving GPU, each
  receiving all N·w bytes (a pipelined broadcast: a node takes them in through all its NICs,
  a GPU through NVLink, whichever is slower).

N is minitp's parameter count of the shape (`exact_param_count`: the output layer tied to
the embedding; Llama 3's own is untied, V·h more, 1.5% for Llama 3 70B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..counts.params import exact_param_count
from .cluster import Cluster

__all__ = ["RefitCost", "refit_cost"]

SERVING = ("collocated", "separate")


@dataclass(frozen=True)
class RefitCost:
    """One refit, a MODEL. Bytes are per serving GPU unless named otherwise."""

    weight_bytes: int         # the whole model, N·w
    need_bytes: float         # what a serving GPU keeps: its slice, N·w/t
    local_bytes: float        # of which it already holds (collocated: its stage's share)
    network_bytes: float      # of which crosses InfiniBand: the minimum a refit receives
    sent_bytes: float         # what the busiest training GPU sends
    seconds: float            # max(received, sent) at the NIC's bandwidth, plus one hop
    broadcast_bytes: int      # naive: every serving GPU receives the whole model
    broadcast_seconds: float  # naive: the gather into one GPU, then the broadcast


def refit_cost(shape, cluster: Cluster, *, dp: int, pp: int, tp: int,
               serving: str = "separate", serve_nodes: int | None = None,
               bytes_per_param: int = 2) -> RefitCost:
    """The refit of `shape`'s weights (`bytes_per_param` each) trained at (dp, pp, tp) on
    `cluster` onto serving nodes at tp, a MODEL (see the module's docstring).
    serving: "collocated" (every training node serves: dp·pp replicas) or "separate"
    (`serve_nodes` nodes of their own, default dp: one for each training replica)."""
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if tp != cluster.gpus_per_node:
        raise ValueError(f"the model prices tp filling a node: tp={tp}, but {cluster.name} "
                         f"has {cluster.gpus_per_node} GPUs a node")
    if serving not in SERVING:
        raise ValueError(f"serving must be one of {SERVING}, got {serving!r}")
    if serving == "collocated" and serve_nodes is not None:
        raise ValueError("collocated serving uses the training nodes: leave serve_nodes out")
    replicas = dp * pp if serving == "collocated" else (dp if serve_nodes is None
                                                        else serve_nodes)
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"serve_nodes must be a positive int, got {serve_nodes!r}")
    total = exact_param_count(shape) * bytes_per_param
    need = total / tp
    shard = need / pp  # one training GPU's: its stage's layers, its tp slice
    if serving == "collocated":
        local, sent = shard, (pp - 1) * shard  # its own stage stays; the others' come in
    else:
        local, sent = 0.0, math.ceil(replicas / dp) * shard
    alpha, ib = cluster.inter_latency, cluster.inter_bandwidth
    received = need - local
    gather = (total - shard) / ib  # into one GPU, through its own NIC
    broadcast = max(total / (cluster.gpus_per_node * ib), total / cluster.intra_bandwidth)
    return RefitCost(weight_bytes=total, need_bytes=need, local_bytes=local,
                     network_bytes=received, sent_bytes=sent,
                     seconds=alpha + max(received, sent) / ib, broadcast_bytes=total,
                     broadcast_seconds=2 * alpha + gather + broadcast)
