"""The two-level network (minitp.calc.network.hierarchy, a MODEL): the sourced node figures, the
hierarchical all-reduce's bytes per level, FSDP's and HSDP's bytes across node boundaries
counted link by link, and the level each axis of a plan lands on."""

from fractions import Fraction

import pytest

import minitp as mt
from minitp.calc.network import hierarchy as hi
from minitp.calc.network.cluster import B200_180GB, B200_XDR, GB, H100_80GB, Cluster

TWO_BY_TWO = Cluster("two nodes of two", 2, 1e12, 10**9, 100 * GB, 10 * GB)


def test_b200_figures_are_the_documents_divided_per_gpu():
    # DGX B200 user guide: 14.4 TB/s of NVLink over 8 GPUs, counted both ways; 8 NICs of
    # 400 Gb/s; 1,440 GB of GPU memory. ConnectX-8: 800 Gb/s.
    assert B200_180GB.intra_bandwidth == 14.4e12 / 8 / 2
    assert B200_180GB.inter_bandwidth == 400e9 / 8 == H100_80GB.inter_bandwidth
    assert B200_180GB.memory * 8 == 1440 * GB
    assert B200_XDR.inter_bandwidth == 800e9 / 8


@pytest.mark.parametrize("g, nodes", [(8, 2), (8, 16), (4, 3)])
def test_hierarchical_all_reduce_moves_the_flat_rings_bytes_but_little_across(g, nodes):
    cluster = Cluster("c", g, 1e12, 10**9, 100 * GB, 10 * GB)
    n, size = g * nodes, 12 * 10**6 * g * nodes
    levels = hi.collective(cluster, "all_reduce", size, n, hierarchical=True)
    assert [lv.level for lv in levels] == [hi.INSIDE, hi.ACROSS, hi.INSIDE]
    inside, across = sum(lv.inside for lv in levels), sum(lv.across for lv in levels)
    assert inside == 2 * Fraction(g - 1, g) * size  # reduce-scatter + all-gather in the node
    assert across == 2 * Fraction(nodes - 1, nodes) * size / g  # each GPU's 1/g, ring of nodes
    assert inside + across == 2 * Fraction(n - 1, n) * size  # the flat ring's bytes per GPU


def test_fsdp_against_hsdp_on_two_nodes_of_two_counted_link_by_link():
    # Flat ring 0→1→2→3→0: links 1→2 and 3→0 cross; each carries (n-1)/n·S per gather or
    # reduce-scatter, three a step. HSDP: rings {0,2}, {1,3} of S/2, all their links cross.
    s = 4000
    crossing_links, per_link = 2, Fraction(3, 4) * s
    fsdp = 3 * crossing_links * per_link
    hsdp = 2 * 2 * (2 * Fraction(1, 2) * s / 2)  # 2 rings x 2 ranks x all-reduce of S/2
    got = {k: hi.dp_step(TWO_BY_TWO, s, 4, k, bytes_per_value=1, grad_bytes=1).crossing
           for k in ("fsdp", "hsdp")}
    assert got == {"fsdp": fsdp, "hsdp": hsdp}
    assert hi.crossing_ratio(4, 2) == fsdp / hsdp == 2.25


def test_hsdp_keeps_its_gathers_inside_and_pays_in_memory():
    step = hi.dp_step(H100_80GB, 10**9, 64, "hsdp", microbatches=4)
    assert step.shards == 8 and hi.dp_step(H100_80GB, 10**9, 64, "fsdp").shards == 64
    assert {p.level for p in step.parts if p.op != "all_reduce"} == {hi.INSIDE}
    fsdp = hi.dp_step(H100_80GB, 10**9, 64, "fsdp", microbatches=4)
    assert fsdp.crossing / step.crossing == pytest.approx(hi.crossing_ratio(64, 8, 4))


def test_axes_land_on_levels_and_the_planner_says_which():
    assert hi.axis_levels(H100_80GB, tp=8, dp=4, pp=2) == {
        "tp": hi.INSIDE, "dp": hi.ACROSS, "pp": hi.ACROSS}
    assert hi.axis_levels(H100_80GB, tp=2, cp=2, dp=8) == {
        "tp": hi.INSIDE, "cp": hi.INSIDE, "dp": hi.BOTH}
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=2048, n_layer=24, n_head=16, d_model=2048)
    best = mt.calc.plan(cfg, H100_80GB, 64, 16, micro_batches=(1,), recompute=(None,))
    levels = best.levels()
    c = best.best
    assert levels == hi.axis_levels(H100_80GB, tp=c.tp, dp=c.dp, pp=c.pp)
    assert levels.get("tp", hi.INSIDE) == hi.INSIDE


@pytest.mark.parametrize("call, words", [
    (lambda: hi.dp_step(H100_80GB, 10, 12, "fsdp"), "whole nodes"),
    (lambda: hi.dp_step(H100_80GB, 10, 16, "zero3"), "strategy must be one of"),
    (lambda: hi.collective(H100_80GB, "broadcast", 10, 8), "op must be one of"),
    (lambda: hi.axis_levels(H100_80GB, mp=2), "unknown axes"),
])
def test_bad_input_is_one_clear_line(call, words):
    with pytest.raises(ValueError, match=words):
        call()
