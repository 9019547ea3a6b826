"""minitp.calc for context parallelism's attentions (issue 38, item 6): ring, all-gather,
Ulysses (a2a) and the hybrid (a2a+ring) — bytes, memory, time, the planner, the crossover.

* bytes: `cp_comm_bytes(cp_comm=...)` by hand from the collectives each variant runs, the
  ring's (the default) the 2(3c−2) messages it always was;
* memory: the all-gather keeps K and V whole, Ulysses the ring's count; and the
  `ActivationLedger` measured on one layer at cp 2 beside `attention_kept_bytes`, every
  byte of the gap named;
* time: `step_time` counts each variant's messages and bytes (the ring's unchanged for
  multi-head attention); `cp_crossover` on a case computed by hand;
* the planner: cp = 1 tries the ring alone; cp > 1 each variant the heads allow.
"""

from __future__ import annotations

import pytest
import torch

import minitp as mt
import minitp.calc as calc
from minitp import context_parallel as cpar

W = 2  # bytes per value, the calculator's default


def gpt(**kw) -> mt.GPTConfig:
    return mt.GPTConfig(**{**dict(vocab_size=64, seq_len=64, n_layer=4, n_head=8,
                                  d_model=64), **kw})  # head_dim 8


# --------------------------------------------------------------------------- bytes
def test_the_ring_is_the_default_and_sends_2_3c_minus_2_messages_of_k_or_v():
    for kw, tp, kv in (({}, 1, 8), ({}, 2, 4), ({"n_kv_head": 2}, 1, 2),
                       ({"n_kv_head": 2}, 4, 1)):  # GQA: K/V heads only, one copy at t > K
        cfg = gpt(**kw)
        for cp in (2, 4):
            message = 2 * (64 // cp) * kv * 8 * W  # b = 2 rows of one rank's K (or V)
            expected = 2 * (3 * cp - 2) * message
            assert calc.cp_comm_bytes(cfg, 2, cp, tp) == expected, (kw, tp, cp)
            assert calc.cp_comm_bytes(cfg, 2, cp, tp, cp_comm="ring") == expected


def test_each_variant_sends_its_collectives_bytes():
    cfg, b, cp = gpt(), 2, 4
    head = b * (64 // cp) * 8 * W  # one head at one rank's s/c positions: 512 bytes
    assert head == 512
    # all-gather K and V (8 heads each; 3 of 4 shares leave), reduce-scatter dK, dV back
    assert calc.cp_comm_bytes(cfg, b, cp, cp_comm="allgather") == 2 * (2 * 3 * 8 * head)
    # TransformerEngine's: K and V all-gathered again in backward, before the reduce-scatter
    assert calc.cp_comm_bytes(cfg, b, cp, cp_comm="allgather-regather") == 3 * (2 * 3 * 8 * head)
    # eight all-to-alls (Q, K, V, O; dO, dQ, dK, dV), 3/4 of 8 heads each
    assert calc.cp_comm_bytes(cfg, b, cp, cp_comm="a2a") == 8 * 6 * head
    # over 2: eight all-to-alls of half of 8 heads; then a ring of 2 holding 4 heads at
    # twice the positions: 2 K/V messages forward, 2 + 4 backward
    hybrid = 8 * 4 * head + (2 + 2 + 4) * 4 * 2 * head
    assert calc.cp_comm_bytes(cfg, b, cp, cp_comm="a2a+ring", cp_a2a_size=2) == hybrid
    assert calc.comm_bytes(cfg, b, cp=cp, cp_comm="a2a")["cp"] == 8 * 6 * head


# --------------------------------------------------------------------------- memory
def test_the_all_gather_keeps_k_and_v_whole_and_ulysses_the_rings_count():
    cfg, b, tp = gpt(), 2, 2
    s, h = cfg.seq_len, cfg.d_model
    for cp in (2, 4):
        per = {comm: calc.activation_bytes_per_layer(cfg, b, tp, cp=cp, cp_comm=comm)
               for comm in mt.rules.CP_COMMS}
        k_and_v = 4 * s * b * h // tp  # 16-bit K and V of this rank's heads, whole s
        assert per["allgather"] - per["ring"] == k_and_v - k_and_v // cp
        assert per["a2a"] == per["a2a+ring"] == per["allgather-regather"] == per["ring"]
        for recompute in ("selective", "full"):  # the attention reruns: local inputs only
            kept = {calc.activation_bytes_per_layer(cfg, b, tp, cp=cp, cp_comm=comm,
                                                    recompute=recompute)
                    for comm in mt.rules.CP_COMMS}
            assert len(kept) == 1, (cp, recompute, kept)
    ring = calc.memory_per_gpu(cfg, 1, cp=2)
    gathered = calc.memory_per_gpu(cfg, 1, cp=2, cp_comm="allgather")
    layer_gap = (calc.activation_bytes_per_layer(cfg, 1, cp=2, cp_comm="allgather")
                 - calc.activation_bytes_per_layer(cfg, 1, cp=2))
    assert gathered["total"] - ring["total"] == cfg.n_layer * layer_gap


LEDGER_CFG = dict(vocab_size=10, seq_len=32, n_layer=1, n_head=4, d_model=16)
LEDGER_KV = (None, 2)  # n_kv_head: GPT-2 (a K/V head per query head), and GQA
LEDGER_COMMS = ("ring", "allgather", "a2a")


def _core_bytes():
    """The bytes layer 0's attention core keeps for backward on this rank of cp 2 (the
    ledger, measured), float64, for each variant and K/V head count."""
    mesh, out = mt.Mesh(cp=2), {}
    for kv in LEDGER_KV:
        for comm in LEDGER_COMMS:
            torch.manual_seed(0)
            cfg = mt.GPTConfig(**LEDGER_CFG, n_kv_head=kv)
            model = mt.GPT(cfg).to(device=mt.device(), dtype=torch.float64)
            cpar.apply_context_parallel(model, mesh.cp, comm, cpar.attention_axes(mesh, comm))
            x = cpar.split_sequence(torch.randint(0, 10, (2, cfg.seq_len), device=mt.device()),
                                    mesh.cp)
            with mt.memory.ActivationLedger(model) as ledger:
                model(x, x)
            out[kv, comm] = sum(e.nbytes for e in ledger.layer("layer0")
                                if ".attn.core" in e.module)
    return out


def test_the_ledger_measures_what_the_model_says_each_attention_keeps():
    """The model's Q, K and V and probabilities (dropout 0: none of Table 2's dropout
    terms is kept), in float64, against the ledger; the gap, named: the ring recomputes
    its probabilities and keeps its output and log-sum-exp instead (flash-style), and its
    K and V at their own K/V heads (it widens them block by block: kv/a of the model's
    widened K and V); the written-out cores keep their boolean causal mask (s/c rows of it
    under the all-gather, all s×s under Ulysses) and the 1/√d scale, a float64 scalar."""
    b, cp, w = 2, 2, 8
    s, a, h = LEDGER_CFG["seq_len"], LEDGER_CFG["n_head"], LEDGER_CFG["d_model"]
    model, gap = {}, {}
    for kv in LEDGER_KV:
        cfg = mt.GPTConfig(**LEDGER_CFG, n_kv_head=kv)
        for comm in LEDGER_COMMS:
            kept = calc.attention_kept_bytes(cfg, b, cp=cp, cp_comm=comm, bytes_per_value=w)
            model[kv, comm] = kept["q"] + kept["k_and_v"] + kept["probabilities"]
        q = b * s // cp * h * w  # one rank's Q, or the ring's output O
        narrow = 2 * q * (a - cfg.kv_heads) // a  # K, V widened from kv to a heads, s/c
        gap[kv, "ring"] = q + b * a * s // cp * w - b * a * s * s // cp * w - narrow
        gap[kv, "allgather"], gap[kv, "a2a"] = s // cp * s + 8, s * s + 8
    for rank, measured in enumerate(mt.launch(_core_bytes, cp, timeout=60)):
        for key, value in model.items():
            assert measured[key] == value + gap[key], (rank, key, measured[key], value)


# --------------------------------------------------------------------------- time
def test_the_rings_step_time_is_2_3c_minus_2_sends_of_k_or_v_less_what_attention_hides():
    cluster, cp, tp, b = calc.A100_80GB, 4, 2, 1
    for kw, kv in (({}, 4), ({"n_kv_head": 2}, 1)):  # a tp rank's K/V heads
        cfg = gpt(**kw)
        t = calc.step_time(cfg, cluster, tp=tp, cp=cp, micro_batch=b)
        send = cluster.intra_latency + b * (64 // cp) * kv * 8 * W / cluster.intra_bandwidth
        comm = 2 * (3 * cp - 2) * send
        # attention's matmuls on one rank, fwd + bwd, at step_time's efficiency 0.5
        attention = 3 * 2 * b * 64**2 * cfg.n_head * cfg.head_dim / (tp * cp)
        hidden = min(comm, attention / (cluster.peak_flops * 0.5) * (cp - 1) / cp)
        assert 0 < hidden < comm  # this case hides some of it, not all
        assert t.cp == pytest.approx(cfg.n_layer * (comm - hidden), rel=1e-12)


def test_a2a_step_time_counts_its_all_to_alls_and_the_heads_limit_refuses():
    cluster, cfg, cp = calc.A100_80GB, gpt(), 4
    t = calc.step_time(cfg, cluster, cp=cp, cp_comm="a2a")
    sent = calc.cp_comm_bytes(cfg, 1, cp, cp_comm="a2a")
    per_layer = 8 * 3 * cluster.intra_latency + sent / cluster.intra_bandwidth
    assert t.cp == pytest.approx(cfg.n_layer * per_layer, rel=1e-12)
    with pytest.raises(ValueError, match="not divisible by the all-to-all's 4 ranks"):
        calc.step_time(gpt(n_head=6, d_model=48), cluster, cp=cp, cp_comm="a2a")


def test_a_mixture_of_experts_is_priced_with_each_variant():
    cluster, cp = calc.A100_80GB, 4
    moe = gpt(n_experts=4, top_k=2)
    ring, a2a = (calc.moe_step_time(moe, cluster, dp=2, cp=cp, ep=2, cp_comm=comm)
                 for comm in ("ring", "a2a"))
    # the experts' all-to-alls do not depend on the attention's: only the cp term moves
    assert a2a.cp == calc.step_time(moe, cluster, dp=2, cp=cp, cp_comm="a2a").cp != ring.cp
    assert a2a.total - ring.total == pytest.approx(a2a.cp - ring.cp, rel=1e-9)


def test_the_crossover_on_a_case_computed_by_hand():
    """s = 8192 over cp = 4 inside one A100 node (α 5 µs, β 300 GB/s), 32 heads of 128:
    one head at s/c is 2048·128·2 = 512 KiB, one rank's K (or V) 16 MiB."""
    kv = 32 * 2048 * 128 * 2
    alpha, beta = 5e-6, 300e9
    times = calc.cp_crossover(calc.A100_80GB, seq_len=8192, cp=4, heads=32, head_dim=128)
    assert times["ring"] == pytest.approx(20 * (alpha + kv / beta))  # 2(3·4−2) sends
    assert times["allgather"] == pytest.approx(12 * alpha + 12 * kv / beta)  # 4 of 3 steps
    assert times["allgather-regather"] == pytest.approx(18 * alpha + 18 * kv / beta)  # 6 of 3
    assert times["a2a"] == pytest.approx(24 * alpha + 8 * 0.75 * kv / beta)  # 8 of 3 messages
    assert times["refused"] == {}
    assert times["a2a"] < times["allgather"] < times["ring"]
    six = calc.cp_crossover(calc.A100_80GB, seq_len=8192, cp=4, heads=6, head_dim=128)
    assert "a2a" not in six and "whole attention heads" in six["refused"]["a2a"]


# --------------------------------------------------------------------------- the planner
def test_the_planner_tries_the_ring_alone_at_cp_1():
    found = calc.plan(gpt(), calc.A100_80GB, global_batch=8, n_gpus=4, micro_batches=(1,))
    assert found.candidates and {(c.cp_comm, c.cp_a2a_size) for c in found.candidates} == {
        ("ring", None)}
    assert calc.cp_variants(1) == [("ring", None)]


def test_the_planner_tries_each_variant_the_heads_allow():
    assert calc.cp_variants(4) == [("ring", None), ("allgather", None), ("a2a", None),
                                   ("a2a+ring", 2), ("allgather-regather", None)]
    kw = dict(global_batch=8, n_gpus=8, cp=4, micro_batches=(1,), recompute=(None,))
    tried = {(c.cp_comm, c.cp_a2a_size) for c in calc.plan(gpt(), calc.A100_80GB,
                                                           **kw).candidates}
    assert tried == set(calc.cp_variants(4))
    # 6 heads: no all-to-all over 4; over 2 only where tp leaves an even count (tp 1)
    found = calc.plan(gpt(n_head=6, d_model=48), calc.A100_80GB, **kw)
    assert {c.cp_comm for c in found.candidates} == {"ring", "allgather", "a2a+ring",
                                                     "allgather-regather"}
    assert all(c.tp == 1 for c in found.candidates if c.cp_comm == "a2a+ring")
    best = found.best
    assert best.time.total == calc.step_time(
        gpt(n_head=6, d_model=48), calc.A100_80GB, best.dp, best.pp, best.tp, 1, 8, best.sp,
        best.recompute, cp=4, cp_comm=best.cp_comm, cp_a2a_size=best.cp_a2a_size).total


def test_every_configuration_lists_the_variants_at_cp_above_1():
    from minitp.calc.planning.search import every_configuration

    every = every_configuration(gpt(n_head=6, d_model=48), calc.A100_80GB, 8, 8,
                                memory_cap=80 * 2**30, cp=4)
    assert {c.cp_comm for c in every} == {"ring", "allgather", "a2a+ring", "allgather-regather"}
    assert all(c.dp * c.pp * c.tp * 4 == 8 for c in every)
    assert len({c.key() for c in every}) == len(every)


def test_the_core_model_counts_each_cores_terms_by_hand():
    """`cp_core_bytes` on a case small enough to count: b = 1, h = 2, d = 4, s = 8, c = 2,
    float64: m (Q at s/c) = 256 bytes, a score matrix (s/c × s) 512, a ring block
    (s/2c × s/2c) 64, the mask 64 one-byte values, the log-sum-exp 64."""
    def core(comm, **kw):
        shape = dict(rows=1, seq_len=8, heads=2, head_dim=4, cp=2, bytes_per_value=8)
        out = calc.cp_core_bytes(comm, **{**shape, **kw})
        return out.kept, out.working

    assert core("ring") == (4 * 256 + 64, 3 * 64 + 9 * 256)
    assert core("allgather") == (256 + 4 * 256 + 512 + 32 + 8, 2 * 512 + 256 + 4 * 256)
    assert core("a2a") == (3 * 256 + 512 + 64 + 8, 2 * 512 + 3 * 256)
    # its own Q, K, V (and the scale) kept; backward rebuilds the kept all-gather's K, V,
    # probabilities and mask rows
    assert core("allgather-regather") == (3 * 256 + 8, 4 * 256 + 512 + 32 + 2 * 512 + 256
                                          + 4 * 256)
    # cp 4 as 2 x 2: the ring of 2 on 1 head at 8 positions a rank: blocks of 4 x 4
    assert core("a2a+ring", seq_len=16, cp=4, cp_a2a_size=2) == (
        4 * 256 + 64, 3 * 128 + 9 * 256 + 3 * 256)
    with pytest.raises(ValueError, match="2·cp"):
        core("ring", seq_len=12, cp=4)
