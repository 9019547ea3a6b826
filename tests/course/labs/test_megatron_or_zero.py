"""Lesson 21's lab (`minitp.course.labs.megatron_or_zero`) and its picture: ZeRO-3's parameter
bytes through a step, measured by `ParamMemory` at each unit boundary, and the side-by-
side measurement of tensor parallelism and ZeRO on the same ranks.

Budget: one launch of 2 ranks (a 2-layer GPT; tp=2 and ZeRO-3 over dp=2)."""

import pytest
import torch

import minitp as mt
from minitp.course.labs import megatron_or_zero as lab
from minitp.course.viz.zero import zero3_param_memory

CFG = dict(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=16)


@pytest.fixture(scope="module")
def runs():
    return lab.compare(mt.GPTConfig(**CFG), world_size=2, batch=4, steps=2,
                       dtype=torch.float64, configs={"tp=2": (1, 2, 0), "zero-3": (2, 1, 3)})


def test_stage3_peak_is_the_shards_plus_a_unit_and_the_one_prefetched(runs):
    memory = runs["zero-3"][0].memory
    sizes, shards = memory.unit_bytes, memory.shards
    block = sizes["blocks.0"]
    assert sizes["blocks.1"] == block and block == max(sizes.values())
    psi = runs["zero-3"][0].params
    assert shards == sum(sizes.values()) // 2  # each rank keeps half of every padded unit
    assert abs(sum(sizes.values()) - 8 * psi) < 8 * 2 * len(sizes)  # padding: < dp a unit
    first, last = memory.samples[0], memory.samples[-1]
    assert (first.gathered, last.gathered) == (0, 0), "between steps: the shards only"
    for s in memory.samples:  # a unit's forward runs on its own gathered vector
        name = s.what.split()[1]
        if s.what.startswith("fwd ") and s.what.endswith(" begins"):
            assert s.gathered >= sizes[name], s
    ends = {s.what: s.gathered for s in memory.samples if s.what.endswith(" ends")}
    assert ends["fwd blocks.1 ends"] < block, "a block's vector is freed after its forward"
    # the peak: a block's vector and the next one's, prefetched while it computes
    assert memory.peak.total == shards + 2 * block, memory.peak
    assert memory.peak.total == max(s.total for s in memory.samples)
    fig = zero3_param_memory(memory)
    gids = {a.get_gid() for a in fig.axes[0].get_children()}
    assert {"fill-shards", "fill-gathered", "line-units-2", "span-fwd", "span-bwd"} <= gids


def test_tp_and_zero3_train_alike_and_count_their_collectives(runs):
    tp, zero = runs["tp=2"][0], runs["zero-3"][0]
    assert max(abs(a - b) for a, b in zip(tp.losses, zero.losses, strict=True)) < 1e-12
    assert tp.layer_ops == {("tp", "all_reduce", "fwd"): 2, ("tp", "all_reduce", "bwd"): 2}
    assert zero.layer_ops == {("dp", "all_gather", "fwd"): 1, ("dp", "all_gather", "bwd"): 1,
                              ("dp", "reduce_scatter", "bwd"): 1}
    assert tp.memory is None and runs["zero-3"][1].memory is None  # recorded on rank 0 only
    e = 8
    assert zero.states["parameters"] == zero.memory.shards  # stage 3 keeps the shards only
    assert tp.states["total"] < 16 / 2 * e * tp.params  # about half of one device's
    if zero.sent is not None:
        assert zero.sent > sum(zero.ring.values()) > 0


def test_param_memory_refuses_a_model_that_is_not_stage3():
    model = mt.GPT(mt.GPTConfig(**CFG))
    model.zero_stage = 2
    with pytest.raises(ValueError, match="zero_stage=3"):
        lab.ParamMemory(model)
