"""What one context-parallel rank's attention core holds: kept for backward, and at its
peak — a MODEL of minitp's written-out cores, one layer, one rank, one microbatch.

`attention_kept_bytes` prices any model in Korthikanti et al.'s accounting; this module
counts minitp's own cores (`minitp.context_parallel`), term by term from their code, so
that lesson 10 can set the allocator's measured peak beside it. It counts the tensors
the algorithm needs alive at once, not the allocator's every copy: a batched matmul's
contiguous operand copies, gloo's message headers and when a finished send's buffer is
freed are left out, and lesson 10 shows how far that puts the measurement from it.

Sizes, in values (× bytes_per_value), with b rows, h heads (one K/V head per query head,
as the lesson's GPT), head size d, s positions and c = cp ranks:

* m = b·h·(s/c)·d: one of Q, K, V or O at this rank's positions;
* a score matrix: b·h·(s/c)·s under the all-gather (this rank's queries against every
  key), the same count under Ulysses (h/c heads of s×s), and b·h·(s/2c)² for one of the
  ring's blocks (a chunk's queries against a chunk's keys).

Kept (what backward reads): the ring keeps Q, K, V, O at s/c and a log-sum-exp per query
and head (it recomputes the probabilities); the all-gather keeps Q, K and V whole, its
queries' rows of the probabilities and of the causal mask (a byte each); Ulysses keeps
1/c of one device's: Q, K, V and the probabilities of h/c heads at all s, and the whole
s×s mask. The all-gather that gathers again (TransformerEngine's) keeps only Q, K and V at
s/c and the scale (minitp checkpoints its core) and rebuilds in backward what the kept
all-gather kept: the gathered K and V, the probabilities and the mask's rows. The hybrid's
ring runs on h/U heads at U·s/c positions: the ring's kept bytes.

Backward's working set, on top of what is kept (the peak is in backward for every core):
the gradient of the probabilities and of the scores (two score matrices; the ring: three
of its blocks — the recomputed probabilities too); the gradients of what the core was
given (dQ at s/c; the all-gather's dK and dV whole before the reduce-scatter; Ulysses'
dQ, dK, dV regrouped); the ring's messages: K and V received, dK and dV sent and
received, and their sum (8m, and dQ: 9m).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...rules import CP_COMMS, ulysses_size


@dataclass(frozen=True)
class CoreBytes:
    """MODEL, bytes on one rank: `kept` for backward, `working` on top of it at the
    backward's worst moment, `peak` = kept + working; `terms` names each part."""

    kept: int
    working: int
    terms: dict

    @property
    def peak(self) -> int:
        return self.kept + self.working


def cp_core_bytes(cp_comm: str, *, rows: int, seq_len: int, heads: int, head_dim: int,
                  cp: int, cp_a2a_size: int | None = None,
                  bytes_per_value: int = 2) -> CoreBytes:
    """MODEL: what one layer's written-out attention core keeps and holds at its peak on
    one cp rank (see the module for every term). cp = 1 is one device."""
    if cp_comm not in CP_COMMS:
        raise ValueError(f"cp_comm must be one of {', '.join(CP_COMMS)}, got {cp_comm!r}")
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len {seq_len} does not split into 2·cp = {2 * cp} chunks")
    w = bytes_per_value
    m = rows * heads * seq_len // cp * head_dim * w  # Q, K, V or O at s/c positions
    scores = rows * heads * seq_len // cp * seq_len * w  # s/c queries × s keys, every head
    mask, scale, lse = seq_len * seq_len, 8, rows * heads * seq_len // cp * w
    if cp_comm == "ring":
        block = rows * heads * (seq_len // (2 * cp)) ** 2 * w
        return _ring(m, lse, block)
    if cp_comm == "a2a+ring":
        u = ulysses_size(cp_comm, cp, cp_a2a_size)
        ring = cp // u  # h/U heads at U·s/c positions: one block is U of the ring's
        block = rows * heads // u * (seq_len // (2 * ring)) ** 2 * w
        out = _ring(m, lse, block)
        return CoreBytes(out.kept, out.working + 3 * m,
                         {**out.terms, "dQ, dK, dV regrouped (a2a back)": 3 * m})
    if cp_comm in ("allgather", "allgather-regather"):
        kept = {"Q": m, "K and V whole": 2 * cp * m, "probabilities": scores,
                "mask (its rows)": mask // cp, "scale": scale}
        working = {"dP and dS": 2 * scores, "dQ": m, "dK and dV whole": 2 * cp * m}
        if cp_comm == "allgather-regather":  # the forward's kept tensors, rebuilt in backward
            working = {**{f"recomputed: {k}": v for k, v in kept.items()
                          if k not in ("Q", "scale")}, **working}
            kept = {"Q, K, V (its own)": 3 * m, "scale": scale}
    else:  # "a2a": whole sequences of h/c heads
        kept = {"Q, K, V": 3 * m, "probabilities": scores, "mask (whole)": mask,
                "scale": scale}
        working = {"dP and dS": 2 * scores, "dQ, dK, dV": 3 * m}
    return CoreBytes(sum(kept.values()), sum(working.values()),
                     {**{f"kept: {k}": v for k, v in kept.items()}, **working})


def _ring(m: int, lse: int, block: int) -> CoreBytes:
    kept = {"Q, K, V, O": 4 * m, "log-sum-exp": lse}
    working = {"3 blocks (P, dP, dS)": 3 * block,
               "messages (K, V in; dK, dV out, in, summed) and dQ": 9 * m}
    return CoreBytes(sum(kept.values()), sum(working.values()),
                     {**{f"kept: {k}": v for k, v in kept.items()}, **working})
