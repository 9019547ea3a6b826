"""Context parallelism's attention variants in the calculator: what each keeps for
backward, how long its communication takes, and where one overtakes another — all of it
a MODEL, per layer, per rank and per microbatch.

The bytes each variant sends are `minitp.rules.cp_attention_bytes` (the one formula, which
the traces' model bytes and `minitp.calc.cp_comm_bytes` read too); the time here adds the
α terms: how many messages a rank sends, each paying a link's latency.

* "ring" over R ranks: 2(3R−2) point-to-point sends (`cp_comm_bytes`);
* "allgather": two all-gathers forward (K, V) and two reduce-scatters backward (dK, dV),
  each c−1 ring steps: 4(c−1) messages; "allgather-regather" gathers K and V again in
  backward: 6(c−1);
* "a2a" over U ranks: four all-to-alls forward (Q, K, V in, O out) and four backward,
  each U−1 messages a rank: 8(U−1), inside tp·U consecutive ranks;
* "a2a+ring": the all-to-all over U, then the ring over cp/U groups (tp·cp ranks wide).

Ranks are laid out as `minitp.Mesh` lays them out: tp fastest, then cp, so an all-to-all
spans tp·U consecutive ranks and a ring or all-gather over cp spans tp·cp.
"""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

from ...rules import CP_COMMS, check_cp_comm, cp_attention_bytes, kv_layout, ulysses_size
from ..counts.params import grouped
from .cluster import Cluster


def attention_kept_bytes(cfg, micro_batch: int, tp: int = 1, cp: int = 1,
                         cp_comm: str = "ring", recompute=None,
                         bytes_per_value: int = 2) -> dict[str, Fraction]:
    """MODEL: what one layer's attention keeps for backward on one rank, in Korthikanti et
    al. 2022's accounting (Table 2's attention terms; `activation_bytes_per_layer`):

    * "q": Q, sbh/t values, at this rank's s/c positions or (Ulysses) its 1/c of the heads
      at all s: 1/c either way;
    * "k_and_v": K and V widened to the core's query heads (its repeat under GQA), 2sbh/t
      values: 1/c of them under the ring and Ulysses (whole s, 1/c of the heads), whole
      under "allgather" (every rank holds the gathered K and V; "allgather-regather" keeps
      its own and gathers them again in backward, 1/c like the ring). Selective recomputation
      reruns the whole attention, its collectives included: it keeps the core's inputs,
      this rank's K/V heads at s/c, under every variant;
    * "probabilities": the softmax output, a·s²·b/t values over c: s/c query rows against
      all s keys (ring, all-gather), or a/c heads of whole s×s (Ulysses): the same count;
    * "dropout": its mask (1 byte) and output, counted as Table 2 counts them.

    Selective recomputation keeps no probabilities; full recomputation nothing of these
    (`activation_bytes_per_layer`). minitp's ring keeps no probabilities either (it
    recomputes them from the log-sum-exp, as flash attention does, and keeps its output
    and that log-sum-exp), and its K and V at their own K/V heads: the model counts the
    probabilities and widened K and V, as before the variants. tests/calc/test_cp_calc.py
    sets the `ActivationLedger` beside it at cp 2, every byte of the gap named (the
    written-out cores' boolean causal mask, s/c rows of it or all s×s under Ulysses).
    """
    if cp_comm not in CP_COMMS:
        raise ValueError(f"cp_comm must be one of {', '.join(CP_COMMS)}, got {cp_comm!r}")
    s, b, h, a, w = cfg.seq_len, micro_batch, cfg.d_model, cfg.n_head, bytes_per_value
    q = Fraction(s * b * h * w, tp * cp)
    if recompute == "selective":  # the core's inputs: this rank's K/V heads at s/c
        k_and_v = 2 * s * b * Fraction(h, a) * kv_heads_per_tp_rank(cfg, tp) * w / cp
    else:
        k_and_v = Fraction(2 * s * b * h * w, tp * (1 if cp_comm == "allgather" else cp))
    scores = Fraction(a * s * s * b, tp * cp)
    if recompute == "selective":
        scores = Fraction(0)
    return {"q": q, "k_and_v": k_and_v, "probabilities": scores * w,
            "dropout": scores * (1 + w)}


def kv_heads_per_tp_rank(cfg, tp: int) -> Fraction:
    """The K/V heads one tp rank computes: K/t, or 1 where t exceeds K (replicated);
    a GPT-2 layer has a K/V head per query head, a/t."""
    if not grouped(cfg):
        return Fraction(cfg.n_head, tp)
    return Fraction(cfg.kv_heads, tp) if kv_layout(cfg, tp) == "split" else Fraction(1)


def _tp_rank_heads(heads: int, kv_heads: int, tp: int) -> tuple[int, int]:
    """The query and K/V heads one tp rank's core receives (K/V: split or one copy)."""
    return heads // tp, kv_heads // tp if kv_heads % tp == 0 else 1


def cp_layer_seconds(cluster: Cluster, cp_comm: str, *, rows: int, seq_len: int, heads: int,
                     kv_heads: int, head_dim: int, cp: int, tp: int = 1,
                     cp_a2a_size: int | None = None, bytes_per_value: int = 2) -> float:
    """MODEL: seconds one rank spends in context parallelism's communication for one
    layer's attention forward and backward (α–β: each message a link's latency, every
    byte at its bandwidth, nothing overlapped). ``heads``, ``kv_heads``: the model's
    (tp splits them first, K/V replicated where tp is above them)."""
    if cp == 1:
        return 0.0
    q_heads, kv = _tp_rank_heads(heads, kv_heads, tp)
    shape = dict(rows=rows, heads=q_heads, kv_heads=kv, head_dim=head_dim,
                 bytes_per_value=bytes_per_value)
    sent = cp_attention_bytes(cp_comm, seq_len=seq_len, cp=cp, cp_a2a_size=cp_a2a_size,
                              **shape)
    total = sent["fwd"] + sent["bwd"]
    if cp_comm in ("allgather", "allgather-regather"):  # 2 or 3 collectives of K and V
        steps = 4 if cp_comm == "allgather" else 6
        return _seconds(cluster, steps * (cp - 1), total, tp * cp)
    u = ulysses_size(cp_comm, cp, cp_a2a_size)
    a2a = 0
    if u > 1:  # the all-to-alls alone: a2a over U ranks of s·U/c positions
        alone = cp_attention_bytes("a2a", seq_len=seq_len * u // cp, cp=u, **shape)
        a2a = alone["fwd"] + alone["bwd"]
    ring, ring_bytes = cp // u, total - a2a
    seconds = _seconds(cluster, 8 * (u - 1), a2a, tp * u) if u > 1 else 0.0
    if ring > 1:
        seconds += _seconds(cluster, 2 * (3 * ring - 2), ring_bytes, tp * cp)
    return seconds


def _seconds(cluster: Cluster, messages: int, nbytes: int, span: int) -> float:
    """α–β of ``messages`` of equal size, ``nbytes`` in all, over a ``span``-wide group:
    messages × (α + one message's bytes / β), as `Cluster.collective_seconds` prices a
    ring's steps."""
    alpha, beta = cluster.link(span)
    return messages * (alpha + nbytes / messages / beta)


def cp_crossover(cluster: Cluster, *, seq_len: int, cp: int, heads: int, head_dim: int,
                 kv_heads: int | None = None, rows: int = 1, tp: int = 1,
                 cp_a2a_size: int | None = None, bytes_per_value: int = 2) -> dict:
    """MODEL: each context-parallel attention's communication seconds per layer and
    microbatch (forward and backward, `cp_layer_seconds`), for drawing where one overtakes
    another in s, cp and heads. ``{"ring": ..., "allgather": ..., "a2a": ...}``, and
    "a2a+ring" when ``cp_a2a_size`` is given; a variant the heads cannot run
    (`minitp.rules.check_cp_comm`: Ulysses needs whole heads on each of its ranks) is
    absent, its reason under "refused": ``{name: message}``."""
    kv_heads = heads if kv_heads is None else kv_heads
    shape = SimpleNamespace(n_head=heads, kv_heads=kv_heads)  # what the rules read
    out, refused = {}, {}
    for name in CP_COMMS:
        if name == "a2a+ring" and cp_a2a_size is None:
            continue
        u = cp_a2a_size if name == "a2a+ring" else None
        try:
            check_cp_comm(shape, cp, tp, name, u)
        except ValueError as error:
            refused[name] = str(error)
            continue
        out[name] = cp_layer_seconds(cluster, name, rows=rows, seq_len=seq_len, heads=heads,
                                     kv_heads=kv_heads, head_dim=head_dim, cp=cp, tp=tp,
                                     cp_a2a_size=u, bytes_per_value=bytes_per_value)
    return {**out, "refused": refused}
