"""minitp.calc.inference.serving: prefill and decode, against the figures the sources publish.

* the KV cache's bytes: the Scaling Book's 6.7 GB for one 8192-token LLaMA 2-13B sequence
  (§7, inference.md, "What about memory?") and 160 kB a token for LLaMA 3-70B in int8
  (§8, applied-inference.md);
* the critical batch: its 240 for a TPU v5e (1.97e14 FLOP/s over 8.2e11 B/s, inference.md);
* the weights: LLaMA 3-70B's 70e9 parameters, summed part by part in §6 (applied-training.md);
* what tp does to a rank's cache (split, or one head each when tp exceeds the K/V heads),
  and where its all-reduces make it stop paying.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import minitp.calc as calc
from minitp.calc.inference.serving import (
    LLAMA3_8B,
    LLAMA3_70B,
    DecoderShape,
    critical_batch,
    decode_intensity,
    decode_step_time,
    kv_cache_bytes_per_token,
    max_decode_batch,
    tp_stops_paying,
    weight_params_read,
)

LLAMA2_13B = DecoderShape("LLaMA 2-13B", n_layer=40, d_model=5120, n_head=40, n_kv_head=40,
                          ffn_hidden=13824, vocab_size=32000, seq_len=4096, source="test")


def test_the_cache_bytes_are_the_scaling_books():
    assert kv_cache_bytes_per_token(LLAMA2_13B) * 8192 == pytest.approx(6.7e9, rel=0.01)
    assert kv_cache_bytes_per_token(LLAMA3_70B, bytes_per_value=1) == pytest.approx(160e3,
                                                                                   rel=0.03)


def test_the_critical_batch_is_the_scaling_books_240():
    tpu_v5e = calc.Cluster("TPU v5e", 8, 1.97e14, 16 * 2**30, 1, 1, memory_bandwidth=8.2e11)
    assert critical_batch(tpu_v5e) == pytest.approx(240, rel=0.01)


def test_llama3_70b_reads_its_70e9_weights_less_the_input_embedding():
    published = 56.3e9 + 2.1e9 + 12e9  # §6's parts: FFW, both embeddings, attention
    embedding = LLAMA3_70B.vocab_size * LLAMA3_70B.d_model
    assert weight_params_read(LLAMA3_70B) + embedding == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_a_ranks_cache_is_its_kv_heads_share(tp):
    whole = kv_cache_bytes_per_token(LLAMA3_8B)
    kept = max(LLAMA3_8B.n_kv_head // tp, 1)  # tp above the 8 K/V heads: one each, copied
    assert kv_cache_bytes_per_token(LLAMA3_8B, tp=tp) * LLAMA3_8B.n_kv_head == whole * kept


def test_gqa_keeps_a_cache_n_head_over_n_kv_head_times_smaller():
    mha = replace(LLAMA3_70B, n_kv_head=LLAMA3_70B.n_head)
    assert kv_cache_bytes_per_token(mha) == 8 * kv_cache_bytes_per_token(LLAMA3_70B)
    assert max_decode_batch(mha, calc.H100_80GB, 8192, tp=8) < max_decode_batch(
        LLAMA3_70B, calc.H100_80GB, 8192, tp=8) // 7


def test_intensity_grows_with_the_batch_until_the_cache_caps_it():
    # a short context: about B FLOPs a byte at bf16 (2 FLOPs per 2-byte weight, B tokens)
    assert decode_intensity(LLAMA3_8B, 16, 1) == pytest.approx(16, rel=0.01)
    # a long one: never above 2N/(T·c) + H/K at bf16 (32 query heads read 8 K/V heads)
    cap = (2 * weight_params_read(LLAMA3_8B) / (8192 * kv_cache_bytes_per_token(LLAMA3_8B))
           + 32 / 8)
    assert decode_intensity(LLAMA3_8B, 10**6, 8192) == pytest.approx(cap, rel=1e-3)
    assert cap < calc.H100_80GB.balance_point / 10


def test_tp_stops_paying_where_the_all_reduces_latency_outgrows_the_reads():
    no_latency = replace(calc.H100_80GB, intra_latency=0.0)
    assert tp_stops_paying(LLAMA3_8B, no_latency, 8, 4096) == 8
    assert tp_stops_paying(LLAMA3_8B, calc.H100_80GB, 8, 4096) < 8
    step = decode_step_time(LLAMA3_8B, calc.H100_80GB, 8, 4096, tp=8)
    assert step.bound == "communication" and "model" in repr(step)


@pytest.mark.parametrize("shape", [LLAMA3_8B, LLAMA3_70B])
def test_a_one_shot_all_reduce_keeps_tp_paying_where_a_ring_stops(shape):
    # batch 8, 4096 cached: the ring's 2(t−1) hops (the default price, unchanged) stop tp
    # after 4; one hop whatever t keeps tp gaining up to a node's 8 GPUs
    assert tp_stops_paying(shape, calc.H100_80GB, 8, 4096) == 4
    assert tp_stops_paying(shape, calc.H100_80GB, 8, 4096, allreduce="one_shot") == 8


def test_bad_input_is_one_clear_line():
    with pytest.raises(ValueError, match="batch must be a positive int"):
        decode_step_time(LLAMA3_8B, calc.H100_80GB, 0, 4096)
    with pytest.raises(ValueError, match="no sourced HBM bandwidth"):
        decode_step_time(LLAMA3_8B, calc.DGX2H_V100, 1, 4096)
    assert max_decode_batch(LLAMA3_70B, calc.H100_80GB, 8192) == 0  # 140 GB of weights
