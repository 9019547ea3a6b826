"""How much of context parallelism's communication a step waits for, once the ring hides
its messages behind attention's compute — a MODEL, per layer, per rank, per microbatch.

`cp_layer_seconds` adds every message up, nothing overlapped. That ranks the variants by
communication time, but the ring exists to overlap: while a rank computes one block it
already sends the next. So, per layer:

* attention's compute on one rank: the causal QKᵀ and PV matmuls, 2·b·s²·h·d FLOPs
  forward over all ranks (half of the 4·b·s²·h·d of a full mask), twice that backward,
  split over tp·c ranks, at ``efficiency`` × the GPU's peak (`minitp.calc.step_time`'s
  assumption);
* the ring: each of its c steps computes one block pair while the next block travels, so
  all but the last step's compute can hide it: exposed = max(0, comm − (c−1)/c · compute);
* the all-gather (either kind) and the all-to-all: exposed whole. Attention cannot start
  before its keys (or heads) have arrived. TransformerEngine's
  ``AttnFuncWithCPAndKVAllGather`` says of itself "KV all-gather between CP ranks is
  exposed", and its ``flash_attn_a2a_communicate`` overlaps one tensor's all-to-all with
  another's reshaping, not with attention (transformer_engine/pytorch/attention/
  dot_product_attention/context_parallel.py); Megatron-LM calls those functions;
* the hybrid: its all-to-alls exposed, its ring over c/U groups hidden as the ring's.

What it leaves out: the ring's messages compete with the compute for memory bandwidth and
SMs, and a GPU overlaps imperfectly; so read "exposed 0" as "mostly hidden".
"""

from __future__ import annotations

from .cluster import Cluster
from .context_parallel import cp_layer_seconds

EXPOSED = ("allgather", "allgather-regather", "a2a")  # attention waits for all of it


def attention_seconds(cluster: Cluster, *, rows: int, seq_len: int, heads: int,
                      head_dim: int, cp: int, tp: int = 1, efficiency: float = 0.5) -> float:
    """MODEL: one rank's causal attention matmuls for one layer, forward and backward."""
    forward = 2 * rows * seq_len ** 2 * heads * head_dim  # causal: half of QKᵀ and PV
    return 3 * forward / (tp * cp) / (cluster.peak_flops * efficiency)


def cp_exposed_seconds(cluster: Cluster, cp_comm: str, *, rows: int, seq_len: int,
                       heads: int, kv_heads: int, head_dim: int, cp: int, tp: int = 1,
                       cp_a2a_size: int | None = None, bytes_per_value: int = 2,
                       efficiency: float = 0.5) -> dict[str, float]:
    """MODEL: ``{"comm", "compute", "hidden", "exposed"}`` seconds for one layer on one rank
    (see the module): the messages' time, attention's compute, what of the messages hides
    behind it and what the step still waits for."""
    if cp_comm == "a2a+ring" and cp_a2a_size is None:
        raise ValueError("cp_comm='a2a+ring' needs cp_a2a_size: which part is the ring's")
    shape = dict(rows=rows, seq_len=seq_len, heads=heads, kv_heads=kv_heads,
                 head_dim=head_dim, tp=tp, bytes_per_value=bytes_per_value)
    comm = cp_layer_seconds(cluster, cp_comm, cp=cp, cp_a2a_size=cp_a2a_size, **shape)
    compute = attention_seconds(cluster, rows=rows, seq_len=seq_len, heads=heads,
                                head_dim=head_dim, cp=cp, tp=tp, efficiency=efficiency)
    if cp == 1 or cp_comm in EXPOSED:
        return {"comm": comm, "compute": compute, "hidden": 0.0, "exposed": comm}
    ring, ring_comm = cp, comm
    if cp_comm == "a2a+ring":  # only the ring over the c/U groups can hide
        u = cp_a2a_size
        ring = cp // u
        ring_comm = comm - cp_layer_seconds(cluster, "a2a", cp=u,
                                            **{**shape, "seq_len": seq_len * u // cp})
    hidden = min(ring_comm, compute * (ring - 1) / ring)
    return {"comm": comm, "compute": compute, "hidden": hidden, "exposed": comm - hidden}


def ring_hop_and_block(cluster: Cluster, *, tokens: int, heads: int, kv_heads: int,
                       head_dim: int, span: int, rows: int = 1, bytes_per_value: int = 2,
                       efficiency: float = 0.5) -> dict[str, float]:
    """MODEL: one forward step of the ring on one rank holding ``tokens`` = s/c positions:
    ``"hop"``, the seconds to pass one rank's K and V to the next rank (α + bytes/β over a
    ``span``-wide group: inside a node or across nodes); ``"block"``, the seconds of the
    attention it hides behind — the rank's queries against one other rank's keys, of whose
    four chunk pairs the causal mask keeps two under the load-balanced split:
    2·b·n²·h·d FLOPs; ``"tokens_to_hide"``: the least s/c whose block covers its hop (the
    block grows as n², the hop as n, so every longer sequence hides too)."""
    alpha, beta = cluster.link(span)
    per_token = 2 * rows * kv_heads * head_dim * bytes_per_value / beta  # K and V, a token
    per_pair = 2 * rows * heads * head_dim / (cluster.peak_flops * efficiency)
    hop = alpha + per_token * tokens
    block = per_pair * tokens ** 2
    # per_pair·n² = α + per_token·n, solved for n
    least = (per_token + (per_token ** 2 + 4 * per_pair * alpha) ** 0.5) / (2 * per_pair)
    return {"hop": hop, "block": block, "tokens_to_hide": least}
