"""Communication volume per axis: bytes each GPU sends, by the ring algorithm.

A ring all-reduce of S bytes over n ranks sends 2(n−1)/n·S per rank; an
all-gather or reduce-scatter (n−1)/n·S (S the full tensor) — a MODEL, the same
one as the ``model_bytes`` of minitp's trace events. Their ``sent_bytes`` are
measured, and on gloo they differ for reduce-scatter: gloo sends an all-reduce's
2(n−1)/n·S for it, twice the ring's (so sequence parallelism moves 1.5× plain
TP's bytes there, and equal bytes on NCCL, whose reduce-scatter is a ring).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from ...rules import check_recompute, cp_attention_bytes, ring_send_fraction
from .._util import number
from ..counts.params import params_per_rank


def ring_wire_bytes(op: str, nbytes: int, n: int) -> int | float:
    """Bytes one rank sends in a ring `op` on a tensor of ``nbytes`` over ``n`` ranks:
    the model of `minitp.rules.ring_send_fraction`, exact (not rounded to bytes)."""
    return number(nbytes * ring_send_fraction(op, n))


def tp_collectives_per_layer(recompute=None, early_stop: bool = False,
                             sp: bool = False) -> int | Fraction:
    """All-reduces (or, with sequence parallelism, pairs of all-gather and
    reduce-scatter) of one activation per layer per microbatch: 2 forward
    (after attention and after the MLP: g) and 2 backward (the conjugate f's).

    Full recomputation runs the forward again in backward: Megatron-LM's
    checkpoint reruns the whole layer, 2 more; torch's non-reentrant checkpoint
    (minitp) stops once it has what backward needs (``early_stop``): without
    sequence parallelism that is the attention's g, 1 more; with it, the
    attention's all-gather and reduce-scatter and the MLP's all-gather (the MLP's
    closing reduce-scatter feeds nothing saved), 3 halves = 1.5 more.
    """
    check_recompute(recompute)
    if recompute != "full":
        return 4
    if not early_stop:
        return 6
    return Fraction(11, 2) if sp else 5


def tp_comm_bytes(cfg, micro_batch: int, tp: int, recompute=None, bytes_per_value: int = 2,
                  early_stop: bool = False, sp: bool = False) -> int | float:
    """Bytes one GPU sends for tensor parallelism per layer per microbatch.

    Narayanan et al. 2021, §3.3: tensors of bsh values are all-reduced twice in
    the forward and twice in the backward pass of every layer, "a total
    communication of 8bsh(t−1)/t per layer per device for each microbatch" —
    counted in values; here times ``bytes_per_value``. Sequence parallelism
    sends the same bytes (each all-reduce becomes a reduce-scatter plus an
    all-gather; Korthikanti et al. 2022, §4.2.2).
    """
    b, s, h = micro_batch, cfg.seq_len, cfg.d_model
    activation = b * s * h * bytes_per_value
    per_collective = Fraction(ring_wire_bytes("all_reduce", activation, tp))
    value = tp_collectives_per_layer(recompute, early_stop, sp) * per_collective
    return number(value)


def pp_comm_bytes(cfg, micro_batch: int, tp: int = 1, sp: bool = False,
                  bytes_per_value: int = 2) -> int | float:
    """Bytes one GPU sends across one stage boundary per microbatch, in each
    direction (activations forward, their gradients backward).

    Narayanan et al. 2021, §3.3: bsh values between consecutive stages. With
    sequence parallelism each tensor-parallel rank holds, and sends, its 1/t of
    the sequence (Megatron-LM's scatter/gather optimisation, §4.1, gets the same
    1/t without it, at the cost of an all-gather within the node; not modelled).
    """
    value = Fraction(micro_batch * cfg.seq_len * cfg.d_model * bytes_per_value, tp if sp else 1)
    return number(value)


def cp_comm_bytes(cfg, micro_batch: int, cp: int, tp: int = 1, bytes_per_value: int = 2,
                  cp_comm: str = "ring", cp_a2a_size: int | None = None) -> int | float:
    """MODEL: bytes one GPU sends for context parallelism per layer per microbatch,
    forward and backward, as minitp's attention ``cp_comm`` sends them
    (`minitp.context_parallel`): `minitp.rules.cp_attention_bytes`, the one formula the
    traces' model bytes read too, on this tp rank's heads.

    The ring (the default) passes one rank's K or V per message: b·(s/c)·h/t values (its
    heads only under tensor parallelism) — with grouped-query attention its K/V heads
    only, b·(s/c)·k·d_head values for the k K/V heads a tp rank holds (n_kv/t, or the one
    it shares when t is above n_kv), the ring carrying them narrow: n_kv/n_head of
    multi-head attention's bytes. Forward: K and V passed c−1 hops, 2(c−1) messages;
    backward: K and V again, 2(c−1), and the dK/dV accumulators c hops (the last
    one home), 2c. In all 2(3c−2) messages, and nothing when c = 1. The trace
    counts the same messages (tests/context_parallel/test_context_parallel.py).
    "allgather", "a2a" (Ulysses) and "a2a+ring" (its all-to-all over ``cp_a2a_size``
    ranks): the rule's docstring; tests/context_parallel/test_cp_variants.py sets every
    one beside its trace. Recomputation's second forward (and its sends) is not counted.
    """
    if cp == 1:
        return 0
    kv_heads = getattr(cfg, "kv_heads", cfg.n_head)  # a rank's: its share, or its one copy
    local = kv_heads // tp if kv_heads % tp == 0 else 1
    sent = cp_attention_bytes(cp_comm, rows=micro_batch, seq_len=cfg.seq_len,
                              heads=cfg.n_head // tp, kv_heads=local, head_dim=cfg.head_dim,
                              cp=cp, cp_a2a_size=cp_a2a_size, bytes_per_value=bytes_per_value)
    return sent["fwd"] + sent["bwd"]


def dp_comm_bytes(n_params: int, dp: int, bytes_per_value: int = 2,
                  zero_stage: int = 0) -> int | float:
    """Bytes one GPU sends for data parallelism per iteration.

    All-reducing the gradients: 2(d−1)/d of their bytes. ZeRO stages 1 and 2
    send the same (a reduce-scatter of gradients and an all-gather of updated
    parameters); stage 3 adds an all-gather of the parameters for the backward
    pass: 3(d−1)/d·Ψ, 1.5× (Rajbhandari et al. 2020, §7).
    """
    halves = 3 if zero_stage == 3 else 2
    value = Fraction(halves * (dp - 1) * n_params * bytes_per_value, dp)
    return number(value)


def comm_bytes(cfg, micro_batch: int, dp: int = 1, pp: int = 1, tp: int = 1, sp: bool = False,
               recompute=None, bytes_per_value: int = 2, grad_bytes: int = 2,
               zero_stage: int = 0, cp: int = 1, cp_comm: str = "ring",
               cp_a2a_size: int | None = None) -> dict:
    """Bytes one GPU sends, per axis:

    * ``"tp"``: per layer per microbatch (`tp_comm_bytes`);
    * ``"pp"``: per stage boundary per microbatch, each way (`pp_comm_bytes`);
    * ``"dp"``: per iteration, for the gradients of the largest stage (`dp_comm_bytes`);
    * ``"cp"`` (only with cp > 1): per layer per microbatch (`cp_comm_bytes`, for the
      attention ``cp_comm``, all-to-all over ``cp_a2a_size`` for "a2a+ring"). Each
      rank then holds s/cp of the sequence, so the tp and pp terms are divided by
      cp, and the gradients are summed over dp·cp.

    An axis of size 1 sends nothing. All of it a MODEL (the ring formulas).
    """
    n_params = params_per_rank(cfg, tp, pp)
    local = cfg if cp == 1 else replace(cfg, seq_len=cfg.seq_len // cp)
    out = {
        "tp": tp_comm_bytes(local, micro_batch, tp, recompute, bytes_per_value),
        "pp": pp_comm_bytes(local, micro_batch, tp, sp, bytes_per_value) if pp > 1 else 0,
        "dp": dp_comm_bytes(n_params, dp * cp, grad_bytes, zero_stage),
    }
    if cp > 1:
        out["cp"] = cp_comm_bytes(cfg, micro_batch, cp, tp, bytes_per_value, cp_comm,
                                  cp_a2a_size)
    return out


def moe_all_to_all_bytes(tokens: int, top_k: int, d_model: int, ep: int,
                         bytes_per_element: int = 2, n_experts: int | None = None,
                         forwards: int = 1) -> dict:
    """MODEL: bytes one rank sends for expert parallelism per MoE layer, under uniform
    routing (every rank and expert equally loaded), no tokens dropped.

    A rank routes ``tokens`` tokens to k experts each: tokens·k rows of d values. Of
    them (ep−1)/ep go to experts on the other ranks. ``"dispatch"`` and ``"combine"``:
    one forward's (the rows out, the same number of rows back). ``"counts"``: the table
    exchanged before each forward's dispatch, E/ep int64 per peer, (ep−1)·(E/ep)·8
    bytes (``n_experts``: E; none given, 0). Backward sends dispatch and combine again
    (each gradient goes back the way its row came, `minitp.expert_parallel.dispatch`)
    and exchanges no counts. ``"per_layer_step"``: all of it, forward and backward,
    for ``forwards`` forwards (microbatches) of ``tokens`` each. Values exact.
    """
    rows = Fraction(tokens * top_k * (ep - 1), ep)
    one = rows * d_model * bytes_per_element
    counts = (ep - 1) * Fraction(n_experts or 0, ep) * 8
    return {"dispatch": number(one), "combine": number(one), "counts": number(counts),
            "per_layer_step": number(forwards * (4 * one + counts))}


def moe_all_to_all_bytes_from_counts(send_rows_per_peer, row_bytes: int, my_rank: int,
                                     n_experts: int | None = None) -> dict:
    """The bytes of `moe_all_to_all_bytes` from actual counts, for one MoE layer and one
    forward: ``send_rows_per_peer[i][j]`` = rows rank i dispatches to rank j (the ep×ep
    table of every rank's send splits). Rank r's dispatch sends row r but its own run;
    its combine sends back what column r received from the others. ``row_bytes``: d
    values' bytes. Same keys; ``n_experts`` as there."""
    table = [[int(v) for v in row] for row in send_rows_per_peer]
    ep = len(table)
    others = [j for j in range(ep) if j != my_rank]
    dispatch = sum(table[my_rank][j] for j in others) * row_bytes
    combine = sum(table[i][my_rank] for i in others) * row_bytes
    counts = (ep - 1) * (n_experts or 0) // ep * 8
    return {"dispatch": dispatch, "combine": combine, "counts": counts,
            "per_layer_step": 2 * (dispatch + combine) + counts}
