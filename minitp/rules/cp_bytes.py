"""Context-parallel attention's bytes: a MODEL (what each variant's collectives would
send), never a measurement. Traces carry the kernel's count beside it.

Per rank, for one attention forward and its backward, in the units the attention core
sees on one tp rank: `heads` query heads and `kv_heads` K/V heads of `head_dim` values,
`rows` sequences of `seq_len` tokens split over `cp` ranks. One rank's share of Q (or of
the output O) is q = rows·(seq_len/cp)·heads·head_dim·w bytes, of K (or V) kv likewise.

* ring over R ranks, each holding m bytes of K (or V): forward 2(R−1)·m (K and V at R−1
  hops); backward 2(R−1)·m again and 2R·m of dK/dV (R hops, the last one home);
* allgather: forward the all-gather of K and V, (cp−1)/cp of cp·kv each: 2(cp−1)·kv;
  backward the reduce-scatter of their gradients, the same 2(cp−1)·kv;
* allgather-regather: the same, and backward gathers K and V again first: 2(cp−1)·kv
  forward, 4(cp−1)·kv backward;
* a2a over U ranks: forward all-to-alls of Q, K, V in and O out, each sending (U−1)/U of
  this rank's tensor; backward dO in and dQ, dK, dV out, the same four. K and V go as
  kv_heads heads where U divides them, else widened to U heads first (one copy each:
  `minitp.rules.ulysses_kv_layout`'s "replicated");
* a2a+ring: the a2a over U, then the ring over R = cp/U ranks holding 1/U of the heads
  and U times the positions.
"""

from __future__ import annotations

from .cp_comm import CP_COMMS, ulysses_size


def ring_attention_bytes(share: int, ring: int) -> dict[str, int]:
    """MODEL: (fwd, bwd) bytes one rank sends for ring attention over `ring` ranks, each
    holding `share` bytes of K (and as many of V)."""
    if ring == 1:
        return {"fwd": 0, "bwd": 0}
    return {"fwd": 2 * (ring - 1) * share, "bwd": 2 * (ring - 1) * share + 2 * ring * share}


def cp_attention_bytes(cp_comm: str, *, rows: int, seq_len: int, heads: int, kv_heads: int,
                       head_dim: int, cp: int, cp_a2a_size: int | None = None,
                       bytes_per_value: int = 2) -> dict[str, int]:
    """MODEL, not measurement: the bytes one rank sends for one causal attention forward
    ("fwd") and backward ("bwd") under context parallelism `cp_comm` (see the module)."""
    if cp_comm not in CP_COMMS:
        raise ValueError(f"cp_comm must be one of {', '.join(CP_COMMS)}, got {cp_comm!r}")
    if cp == 1:
        return {"fwd": 0, "bwd": 0}
    local = rows * (seq_len // cp) * head_dim * bytes_per_value  # one head of this rank
    if cp_comm in ("allgather", "allgather-regather"):
        gather = 2 * (cp - 1) * kv_heads * local  # K and V to the cp−1 others (or dK, dV back)
        return {"fwd": gather, "bwd": gather * (2 if cp_comm == "allgather-regather" else 1)}
    u = ulysses_size(cp_comm, cp, cp_a2a_size)
    sent_kv = kv_heads if kv_heads % u == 0 else u  # "replicated": widened to u heads
    a2a = (u - 1) * (2 * heads + 2 * sent_kv) * local // u  # Q, K, V in; O out (or dO; dQ, dK, dV)
    ring = ring_attention_bytes(u * local * (sent_kv // u), cp // u)
    return {"fwd": a2a + ring["fwd"], "bwd": a2a + ring["bwd"]}
