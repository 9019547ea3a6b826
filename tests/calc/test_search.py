"""The brute force (`minitp.calc.planning.search.every_configuration`) and the planner
(`calc.plan`) agree on the best configuration, and the brute force lists every valid
one; `labs.planning.machine` turns a measured all-reduce fit into a cluster whose
ring model gives that fit back. Pure arithmetic: no processes."""

import dataclasses
from itertools import product

import pytest

import minitp as mt
from minitp import calc
from minitp.calc.planning.search import every_configuration
from minitp.course.labs.planning import machine

GiB = 2**30


def gpt(h, a, layers, s=2048):
    return mt.GPTConfig(vocab_size=51200, seq_len=s, n_layer=layers, n_head=a, d_model=h)


# (model, cluster, GPUs, global batch, memory cap): each binds in a different way
CASES = {
    "gpt3-1024": (gpt(12288, 96, 96), calc.A100_80GB, 1024, 1536, 72 * GiB),
    "gpt3-512-a100-40gb": (gpt(12288, 96, 96), calc.A100_80GB, 512, 1536, 36 * GiB),  # ZeRO
    "22b-64-h100-16gib": (gpt(6144, 64, 48), calc.H100_80GB, 64, 512, 16 * GiB),
    "1.7b-32": (gpt(2304, 24, 24), calc.A100_80GB, 32, 512, 72 * GiB),  # no TP at all
    "gpt3-128-24gib": (gpt(12288, 96, 96), calc.A100_80GB, 128, 256, 24 * GiB),  # all of it
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_planner_choice_is_the_brute_force_best(case):
    cfg, cluster, n, batch, cap = CASES[case]
    every = every_configuration(cfg, cluster, n, batch, cap)
    best = next(c for c in every if c.fits)
    ties = {c.key() for c in every if c.fits and c.time.total == best.time.total}
    capped = dataclasses.replace(cluster, memory=cap / 0.9)  # plan keeps 90% usable
    chosen = calc.plan(cfg, capped, batch, n, micro_batches=(1,), zero_stage=(0, 1, 2, 3),
                       optimizer="megatron").best
    assert chosen.time.total == best.time.total
    assert (chosen.dp, chosen.pp, chosen.tp, chosen.zero_stage, chosen.recompute) in ties


def test_the_cases_reach_the_corners():
    """Somewhere the best needs ZeRO, somewhere ZeRO-3 and full recomputation together."""
    def best(case):
        cfg, cluster, n, batch, cap = CASES[case]
        return next(c for c in every_configuration(cfg, cluster, n, batch, cap) if c.fits)

    assert best("gpt3-512-a100-40gb").zero_stage == 1
    assert (best("gpt3-128-24gib").zero_stage, best("gpt3-128-24gib").recompute) == (3, "full")
    assert best("1.7b-32").tp == 1


def test_every_valid_configuration_is_listed_once():
    cfg = gpt(2304, 24, 24)
    every = every_configuration(cfg, calc.A100_80GB, 32, 512, 40 * GiB)
    keys = [c.key() for c in every]
    assert len(keys) == len(set(keys))
    expected = set()
    for dp, pp, tp in product(range(1, 33), repeat=3):
        if dp * pp * tp != 32:
            continue
        for zero, recompute in product(range(4), (None, "selective", "full")):
            try:
                mt.check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, sequence_parallel=tp > 1,
                                         recompute=recompute, zero_stage=zero)
            except ValueError:
                continue
            expected.add((dp, pp, tp, zero, recompute))
    assert set(keys) == expected
    for c in every:
        assert c.fits == (c.memory["total"] <= 40 * GiB)
        assert c.memory == calc.memory_per_gpu(cfg, 1, c.dp, c.pp, c.tp, c.sp, c.recompute,
                                               c.zero_stage, "megatron",
                                               microbatches=c.microbatches)
    assert [c.time.total for c in every] == sorted(c.time.total for c in every)


@pytest.mark.parametrize("n", [2, 4])
def test_profiled_machine_gives_the_fit_back(n):
    a, c = 300e-6, 2.5e-9  # a measured all-reduce: 300 µs + 2.5 ns per byte
    cluster = machine(20e9, a, c, n)
    for nbytes in (1e3, 1e6, 4e6):
        assert cluster.collective_seconds("all_reduce", nbytes, n, span=n) == pytest.approx(
            a + nbytes * c, rel=1e-12)
    assert cluster.peak_flops == 20e9
