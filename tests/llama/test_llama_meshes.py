"""The Llama-style GPT (`GPTConfig.llama`: RMSNorm, rotary positions, SwiGLU, grouped-query
attention, no biases) under every axis, equal to the single-device model in float64:
every step's loss and every parameter after 3 AdamW steps, on 4 real ranks.

The meshes cover the K/V heads split over tp (tp dividing them) and replicated (tp above
them: a K/V head's gradient summed over the ranks that share it), multi-query attention,
sequence parallelism (RMSNorm's gradients partial), context parallelism (the rotation at
each token's global position after the load-balanced split), pipeline and data
parallelism with ZeRO-1 and ZeRO-3, full recomputation and a zero-bubble schedule. (The
ring's bytes with fewer K/V heads, measured beside `mt.calc`, are lesson 09's checked cell.)
"""

import pytest
import torch
from helpers import assert_every_mesh_matches, random_batches, train_meshes

import minitp as mt

TOLERANCE = 1e-10
LLAMA = dict(vocab_size=32, seq_len=16, n_layer=4, n_head=4, d_model=16, norm="rmsnorm",
             positions="rope", mlp="swiglu", bias=False, n_kv_head=2)

# (mesh sizes, parallelize options, schedule, microbatches, config overrides)
SETTINGS = [
    (dict(dp=2, tp=2), dict(sequence_parallel=True, zero_stage=1), None, 1, {}),  # K/V split
    (dict(tp=4), dict(sequence_parallel=True), None, 1, {}),  # tp 4 > 2 K/V heads: replicated
    (dict(tp=4), {}, None, 1, dict(n_kv_head=1)),  # multi-query: one K/V head on all 4
    (dict(cp=2, tp=2), dict(sequence_parallel=True), None, 1, dict(n_kv_head=1)),  # RoPE at
    (dict(cp=4), {}, None, 1, {}),                        # global positions, the split's chunks
    (dict(pp=2, dp=2), dict(zero_stage=3), None, 2, {}),
    (dict(pp=2, tp=2), dict(sequence_parallel=True, recompute="full"), "zb-h1", 2,
     dict(n_kv_head=1)),
    (dict(dp=4), dict(zero_stage=2), None, 1, dict(n_kv_head=4)),  # one K/V head per query
]


def _train(settings):
    return [result[:2] for result in train_meshes(settings, LLAMA)]


def test_every_mesh_equals_one_device_in_float64():
    run = mt.launch(_train, 4, SETTINGS, timeout=300)
    assert_every_mesh_matches(run, SETTINGS, TOLERANCE)


@pytest.mark.parametrize("tp,kv,message", [
    (3, 2, "n_head=4 is not divisible by tp=3"),
    (4, 3, "n_head=4 is not divisible by n_kv_head=3"),
])
def test_impossible_head_splits_are_refused_in_one_line(tp, kv, message):
    with pytest.raises(ValueError, match=message):
        cfg = mt.GPTConfig(**{**LLAMA, "n_kv_head": kv})
        mt.check_parallel_config(cfg, tp=tp)


def test_tp_neither_dividing_nor_a_multiple_of_the_kv_heads_is_refused():
    cfg = mt.GPTConfig(**{**LLAMA, "n_head": 12, "d_model": 24, "n_kv_head": 4, "ffn_hidden": 48})
    with pytest.raises(ValueError, match="tp=6 with n_kv_head=4: tp must divide the K/V heads"):
        mt.check_parallel_config(cfg, tp=6)
    for tp in (2, 4, 12):  # dividing, equal, a multiple
        mt.check_parallel_config(cfg, tp=tp)


def test_rotary_positions_without_the_q_and_kv_projections_are_refused():
    """GPT-2's fused qkv attention has no rotary step: rope there would train a model with
    no positions at all, so the configuration is refused rather than built."""
    with pytest.raises(ValueError, match="positions='rope' rotates q and k"):
        mt.GPTConfig(positions="rope")


def _tp_collectives(sp):
    """(op, phase) counts of the tensor-parallel collectives of one training step, GPT-2's
    layer and the Llama-style one with its K/V heads split and replicated."""
    counts = {}
    for name, overrides in (("gpt2", dict(norm="layernorm", positions="learned", mlp="gelu",
                                          n_kv_head=None)), ("split", {}),
                            ("replicated", dict(n_kv_head=1))):
        cfg = mt.GPTConfig(**{**LLAMA, **overrides})
        torch.manual_seed(0)
        mesh = mt.Mesh(tp=2)
        model = mt.parallelize(mt.GPT(cfg).double(), mesh, sequence_parallel=sp)
        mt.trace.clear()
        mt.train_step(model, random_batches(1, cfg, 2)[0], mesh,
                      torch.optim.SGD(model.parameters(), lr=0.0))
        ops = [(e.op, e.phase) for e in mt.trace.events()
               if e.op in ("all_reduce", "all_gather", "reduce_scatter") and "layer" in e.label]
        counts[name] = {key: ops.count(key) for key in set(ops)}
    return counts


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_a_llama_layer_costs_gpt2s_tensor_parallel_collectives(sp):
    """q and kv read one input, mapped once (`ParallelInput`): the layer's collectives are
    GPT-2's fused qkv's, 2 forward and 2 backward (4 of each half under SP)."""
    run = mt.launch(_tp_collectives, 2, sp, timeout=120)
    for counts in run:
        assert counts["split"] == counts["gpt2"] == counts["replicated"], counts
