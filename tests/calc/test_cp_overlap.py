"""minitp.calc.network.cp_overlap: what of context parallelism's messages a step waits for once the
ring hides its own behind attention (a MODEL; in process, no ranks)."""

from __future__ import annotations

import pytest

import minitp.calc as calc

LLAMA_70B = dict(rows=1, seq_len=131072, heads=64, kv_heads=8, head_dim=128)


def test_attention_compute_is_three_causal_passes_of_two_matmuls():
    # b = 1, s = 4, 2 heads of 8, c = 2: forward 2·1·16·2·8 = 512 FLOPs over all ranks
    seconds = calc.attention_seconds(calc.H100_80GB, rows=1, seq_len=4, heads=2, head_dim=8,
                                     cp=2, efficiency=0.5)
    assert seconds == pytest.approx(3 * 512 / 2 / (989e12 * 0.5), rel=1e-12)


def test_the_rings_messages_hide_and_the_gathers_do_not():
    """Llama 3 70B at c = 16, no tp: the ring's ~32 ms a layer hide under ~107 ms of
    attention; the all-gathers' and the all-to-all's are paid whole."""
    out = {comm: calc.cp_exposed_seconds(calc.H100_80GB, comm, cp=16, **LLAMA_70B)
           for comm in ("ring", "allgather", "allgather-regather", "a2a")}
    ring = out["ring"]
    assert 0.030 < ring["comm"] < 0.034 and 0.100 < ring["compute"] < 0.110
    assert ring["exposed"] == 0 and ring["hidden"] == ring["comm"]
    for comm in ("allgather", "allgather-regather", "a2a"):
        assert out[comm]["exposed"] == out[comm]["comm"] > 0 and out[comm]["hidden"] == 0
    # unhidden, the all-to-all is the cheapest and the ring the dearest; hidden, the ring wins
    assert out["a2a"]["comm"] < out["allgather"]["comm"] < ring["comm"]
    assert min(out, key=lambda c: out[c]["exposed"]) == "ring"


def test_only_the_compute_of_all_but_the_last_ring_step_hides():
    # a short sequence: attention's compute is small, the ring's messages stick out by
    # comm − (c−1)/c · compute
    kw = dict(rows=1, seq_len=1024, heads=64, kv_heads=8, head_dim=128, cp=4)
    ring = calc.cp_exposed_seconds(calc.H100_80GB, "ring", **kw)
    assert ring["comm"] > ring["compute"]
    assert ring["exposed"] == pytest.approx(ring["comm"] - 3 / 4 * ring["compute"], rel=1e-12)


def test_the_hybrid_hides_its_ring_and_pays_its_all_to_alls():
    kw = dict(LLAMA_70B, cp=16)
    hybrid = calc.cp_exposed_seconds(calc.H100_80GB, "a2a+ring", cp_a2a_size=8, **kw)
    a2a = calc.cp_layer_seconds(calc.H100_80GB, "a2a", **{**kw, "seq_len": 131072 // 2,
                                                          "cp": 8})
    assert hybrid["exposed"] == pytest.approx(a2a, rel=1e-12) and hybrid["hidden"] > 0
    with pytest.raises(ValueError, match="needs cp_a2a_size"):
        calc.cp_exposed_seconds(calc.H100_80GB, "a2a+ring", **kw)


def test_a_ring_block_covers_its_hop_from_the_least_tokens_on():
    kw = dict(heads=64, kv_heads=8, head_dim=128)
    for span in (8, 16):  # inside a DGX H100 node, and across two
        least = calc.ring_hop_and_block(calc.H100_80GB, tokens=1, span=span, **kw)[
            "tokens_to_hide"]
        at = calc.ring_hop_and_block(calc.H100_80GB, tokens=least, span=span, **kw)
        assert at["hop"] == pytest.approx(at["block"], rel=1e-9)
        shorter = calc.ring_hop_and_block(calc.H100_80GB, tokens=least / 2, span=span, **kw)
        assert shorter["block"] < shorter["hop"]
    # NVLink's 450 GB/s against the network's 50: the network needs several times the tokens
    inside, across = (calc.ring_hop_and_block(calc.H100_80GB, tokens=1, span=s, **kw)[
        "tokens_to_hide"] for s in (8, 16))
    assert 4 < across / inside < 9
