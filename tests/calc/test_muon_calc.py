"""Muon's model (`mt.calc.footprint.muon`): its state bytes per rank under ZeRO 0-3, the FLOPs of
Newton–Schulz, the longest-processing-time owners, and what each strategy sends."""

import pytest

import minitp as mt
from minitp.calc.footprint.muon import lpt_owners, ns_flops


def test_a_matrix_parameter_costs_12_bytes_not_adams_16():
    """Lesson 21's 16 bytes per parameter re-derived: Muon keeps one momentum, not two."""
    for muon, adam in (("muon-fp32", "adam-fp32"), ("muon-mixed", "adam-mixed")):
        assert mt.calc.muon_state_bytes(1, 0, optimizer=muon)["total"] == 12
        assert mt.calc.model_state_bytes(1, optimizer=adam)["total"] == 16
        # the rest is AdamW's, byte for byte
        assert (mt.calc.muon_state_bytes(0, 1000, dp=8, zero_stage=2, optimizer=muon)
                == mt.calc.model_state_bytes(1000, dp=8, zero_stage=2, optimizer=adam))


@pytest.mark.parametrize("stage, sharded", [(0, ()), (1, ("optimizer",)),
                                            (2, ("optimizer", "gradients")),
                                            (3, ("optimizer", "gradients", "parameters"))])
def test_zero_shards_muons_state_stage_by_stage(stage, sharded):
    whole = mt.calc.muon_state_bytes(800, 200, dp=1)
    per_rank = mt.calc.muon_state_bytes(800, 200, dp=4, zero_stage=stage)
    for kind in ("parameters", "gradients", "optimizer"):
        assert per_rank[kind] == (whole[kind] / 4 if kind in sharded else whole[kind])
    assert whole["optimizer"] == 800 * 4 + 200 * 8  # one momentum; AdamW's two


def test_newton_schulz_flops_counted_by_hand():
    # 8×32: m=8, n=32; per iteration 2·8·8·32 (Gram) + 2·8³ (its square) + 2·8·8·32
    assert ns_flops(8, 32, steps=1) == 2 * 8 * 8 * 32 * 2 + 2 * 8 ** 3
    assert ns_flops(32, 8) == ns_flops(8, 32)
    # split over 2 along the long side: the Gram side stays 8, each rank half of 32
    assert ns_flops(32, 8, split=2, split_dim=0) == 5 * (4 * 8 * 8 * 16 + 2 * 8 ** 3)


def test_lpt_balances_and_every_rank_computes_the_same_map():
    costs = [7, 5, 4, 3, 3, 2]
    owners = lpt_owners(costs, 2)
    loads = [sum(c for c, o in zip(costs, owners, strict=True) if o == r) for r in range(2)]
    assert sorted(loads) == [12, 12] and owners == lpt_owners(list(costs), 2)


def test_owner_sends_2_over_dp_of_gathers_bytes_with_zero():
    matrices = [(64, 16, None)] * 8
    gather = mt.calc.muon_comm_bytes(matrices, "gather", dp=8, zero_stage=1)["total"]
    owner = mt.calc.muon_comm_bytes(matrices, "owner", dp=8, zero_stage=1)["total"]
    assert owner == gather * 2 / 8
    with pytest.raises(ValueError, match="strategy"):
        mt.calc.muon_comm_bytes(matrices, "scatter")
