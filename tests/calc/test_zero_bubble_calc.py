"""`mt.calc` knows the zero-bubble schedules: the idle per rank and bubble fraction
(`calc.pipeline_idle`, `calc.bubble(..., schedule=)`) equal the schedules played on paper
(`minitp.pipeline.schedules.simulate`) wherever their closed forms' conditions hold; the
microbatches in flight equal simulate's peaks; the planner and the brute force try
"zb-h1" and "zb-h2" under their rules and agree. Pure arithmetic: no processes.

Closed forms (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Table 2: 1F1B
(p−1)(F+B+W), ZB-H1 (p−1)(F+B−W), ZB-H2 (p−1)(F+B−2W); peaks pM_B and (2p−1)M_B).
"""

import dataclasses
from fractions import Fraction
from itertools import product

import pytest

import minitp as mt
from minitp import calc
from minitp.calc.planning.search import every_configuration
from minitp.pipeline.on_paper import simulate

GiB = 2**30
UNIT = dict(F=1, B=1, W=1)
COSTS = [Fraction(1, 2), 1, Fraction(3, 2), 2, 3]


def _idle(schedule, p, m, costs, v=1):
    return calc.pipeline_idle(schedule, p, m, v, costs["F"], costs["B"], costs["W"])


def _check(schedule, p, m, costs, v=1):
    paper, closed = simulate(schedule, p, m, v, costs=costs), _idle(schedule, p, m, costs, v)
    assert closed["idle"] == paper["idle"][0], (schedule, p, m, costs)
    assert closed["stage_idle"] == max(paper["inner_idle"]), (schedule, p, m, costs)
    assert closed["busy"] == paper["busy"]
    assert closed["fraction"] == pytest.approx(float(paper["bubble"]), rel=1e-15)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6])
def test_unit_costs_equal_simulate_on_a_grid(p):
    for m in range(1, 3 * p + 2):
        for schedule in ("gpipe", "1f1b", "zb-h1"):
            _check(schedule, p, m, UNIT)
        if m >= 2 * p - 1:
            _check("zb-h2", p, m, UNIT)
        if m % p == 0:
            _check("interleaved", p, m, UNIT, v=2)


def test_unit_cost_numbers():
    """p = 4, m = 8, F = B = W = 1: 1F1B idles 9, ZB-H1 3, ZB-H2 3 per rank in one step
    (0 inside every stage): fractions 3/8, 1/8, 1/8."""
    assert _idle("1f1b", 4, 8, UNIT) == dict(idle=9, stage_idle=9, busy=24, fraction=0.375)
    assert _idle("zb-h1", 4, 8, UNIT) == dict(idle=3, stage_idle=3, busy=24, fraction=0.125)
    assert _idle("zb-h2", 4, 8, UNIT) == dict(idle=3, stage_idle=0, busy=24, fraction=0.125)
    assert calc.bubble(4, 8) == calc.bubble(4, 8, schedule="1f1b") == 0.375
    assert calc.bubble(4, 8, schedule="zb-h1") == calc.bubble(4, 8, schedule="zb-h2") == 0.125
    assert calc.bubble(4, 8, 2, schedule="interleaved") == 0.1875
    assert calc.bubble(4, 2, schedule="zb-h1") == 5 / 6  # m < p: ((p−1)·2 − (m−1)) / 3m


def test_unequal_costs_equal_simulate_where_the_closed_forms_hold():
    """ZB-H1 when W ≤ F and W ≤ B; ZB-H2's stage_idle when W ≤ F or B ≤ F, its idle
    when B ≤ 2F; GPipe and 1F1B always."""
    checked = 0
    for (f, b, w), p in product(product(COSTS, repeat=3), (2, 3, 4, 5)):
        costs = dict(F=f, B=b, W=w)
        for m in (1, p - 1, p, 2 * p - 1, 3 * p + 1):
            if m < 1:
                continue
            _check("1f1b", p, m, costs)
            _check("gpipe", p, m, costs)
            if w <= min(f, b):
                _check("zb-h1", p, m, costs)
                checked += 1
            if m >= 2 * p - 1:
                paper, closed = simulate("zb-h2", p, m, costs=costs), _idle("zb-h2", p, m, costs)
                if w <= f or b <= f:
                    assert closed["stage_idle"] == max(paper["inner_idle"]), (costs, p, m)
                if b <= 2 * f:
                    assert closed["idle"] == paper["idle"][0], (costs, p, m)
    assert checked > 500


def test_where_the_closed_form_is_a_model_only():
    """A W heavier than F or B: minitp's ZB-H1 order leaves holes (p−1)(F+B−W) misses;
    B > 2F: minitp's ZB-H2 order (greedy for unit costs) idles more than (p−1)·F."""
    heavy_w = dict(F=1, B=1, W=2)
    assert _idle("zb-h1", 4, 8, heavy_w)["idle"] == 0
    assert simulate("zb-h1", 4, 8, costs=heavy_w)["idle"][0] == 3
    heavy_b = dict(F=Fraction(1, 2), B=2, W=1)
    assert _idle("zb-h2", 4, 8, heavy_b)["idle"] == Fraction(3, 2)
    assert simulate("zb-h2", 4, 8, costs=heavy_b)["idle"][0] > Fraction(3, 2)


def test_zb_h2_needs_its_microbatches():
    for call in (lambda: calc.pipeline_idle("zb-h2", 4, 6),
                 lambda: calc.bubble(4, 6, schedule="zb-h2"),
                 lambda: calc.microbatches_in_flight(4, 6, "zb-h2")):
        with pytest.raises(ValueError, match="needs microbatches >= 2\\*pp-1 = 7"):
            call()
    assert simulate("zb-h2", 4, 6)["peak"] == [6] * 4  # what minitp refuses would hold m


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6])
def test_microbatches_in_flight_equal_simulates_peaks(p):
    for m in range(1, 3 * p + 2):
        one, h1 = simulate("1f1b", p, m), simulate("zb-h1", p, m)
        assert calc.microbatches_in_flight(p, m) == max(one["peak"]) == one["peak"][0]
        assert h1["peak"] == [calc.microbatches_in_flight(p, m, "zb-h1")] * p  # every stage
        if m >= 2 * p - 1:
            assert simulate("zb-h2", p, m)["peak"] == [2 * p - 1] * p
            assert calc.microbatches_in_flight(p, m, "zb-h2") == 2 * p - 1
    assert calc.microbatches_in_flight(p, None, "zb-h1") == p
    assert calc.microbatches_in_flight(p, None, "zb-h2") == 2 * p - 1


def test_memory_per_gpu_with_a_schedule():
    """GPT-3 175B, tp 8 with SP and selective recomputation, pp 8, m 64: ZB-H1 holds
    1F1B's activations, ZB-H2 (2p−1)/p = 15/8 of them; the model states do not move."""
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=2048, n_layer=96, n_head=96, d_model=12288)
    kw = dict(micro_batch=1, dp=8, pp=8, tp=8, sp=True, recompute="selective", microbatches=64)
    base, h1, h2 = (calc.memory_per_gpu(cfg, **kw, schedule=s) for s in (None, "zb-h1", "zb-h2"))
    assert base == calc.memory_per_gpu(cfg, **kw) == h1
    assert Fraction(h2["activations"]) == Fraction(base["activations"]) * Fraction(15, 8)
    assert h2["parameters"] == base["parameters"] and h2["optimizer"] == base["optimizer"]
    with pytest.raises(ValueError, match="only the interleaved schedule"):
        calc.memory_per_gpu(cfg, **kw, virtual=2, schedule="zb-h1")


def test_step_time_bubble_with_a_schedule():
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=2048, n_layer=96, n_head=96, d_model=12288)
    kw = dict(dp=8, pp=16, tp=8, global_batch=1536, sp=True)
    one, h1 = (calc.step_time(cfg, calc.A100_80GB, **kw, schedule=s) for s in (None, "zb-h1"))
    assert h1.bubble == pytest.approx(one.bubble / 3)  # (p−1)/(3m) in place of (p−1)/m
    assert (h1.compute, h1.tp, h1.pp, h1.dp) == (one.compute, one.tp, one.pp, one.dp)
    full = dict(kw, recompute="full")
    h1f, h2f = (calc.step_time(cfg, calc.A100_80GB, **full, schedule=s)
                for s in ("zb-h1", "zb-h2"))
    assert h2f.bubble == pytest.approx(h1f.bubble / 2)  # B = 2F: (p−1)/(4m) vs (p−1)/(2m)
    # ZeRO-3's deferred W reduces its unit again: m more reduce-scatters, where ZeRO-2
    # added m - 1 to ZeRO-1 (m = 1536 / 8 = 192 microbatches a rank)
    z1, z2, z3, z3_h1 = (calc.step_time(cfg, calc.A100_80GB, **kw, zero_stage=z, schedule=s).dp
                         for z, s in ((1, None), (2, None), (3, None), (3, "zb-h1")))
    assert z3_h1 - z3 == pytest.approx((z2 - z1) * 192 / 191)


def gpt(h, a, layers, s=2048):
    return mt.GPTConfig(vocab_size=51200, seq_len=s, n_layer=layers, n_head=a, d_model=h)


ALL = (None, "zb-h1", "zb-h2")
# tests/calc/test_search.py's cases, with zero-bubble schedules allowed: the best split
# stays and takes ZB-H1 (same memory, a third of the bubble), except where the best needs
# ZeRO-3, whose deferred W costs a second reduce-scatter each microbatch
PLANS = {
    "1.7b-32": (gpt(2304, 24, 24), calc.A100_80GB, 32, 512, 72 * GiB,
                (8, 4, 1, 0, None, "zb-h1")),
    "gpt3-1024": (gpt(12288, 96, 96), calc.A100_80GB, 1024, 1536, 72 * GiB,
                  (8, 16, 8, 0, None, "zb-h1")),
    "gpt3-512-a100-40gb": (gpt(12288, 96, 96), calc.A100_80GB, 512, 1536, 36 * GiB,
                           (4, 32, 4, 1, "selective", "zb-h1")),
    "gpt3-128-24gib": (gpt(12288, 96, 96), calc.A100_80GB, 128, 256, 24 * GiB,
                       (4, 4, 8, 3, "full", None)),
}


@pytest.mark.parametrize("case", sorted(PLANS))
def test_planner_tries_zero_bubble_schedules_and_agrees_with_the_brute_force(case):
    cfg, cluster, n, batch, cap, expected = PLANS[case]
    every = every_configuration(cfg, cluster, n, batch, cap, schedules=ALL)
    best = next(c for c in every if c.fits)
    capped = dataclasses.replace(cluster, memory=cap / 0.9)
    chosen = calc.plan(cfg, capped, batch, n, micro_batches=(1,), zero_stage=(0, 1, 2, 3),
                       schedules=ALL).best
    key = (chosen.dp, chosen.pp, chosen.tp, chosen.zero_stage, chosen.recompute,
           chosen.schedule)
    ties = {c.key() for c in every if c.fits and c.time.total == best.time.total}
    assert chosen.time.total == best.time.total
    assert key == expected
    assert expected[:5] + ((expected[5],) if expected[5] else ()) in ties
    for c in every:  # their rules: pp > 1, ZB-H2 m ≥ 2p − 1
        if c.schedule:
            assert c.pp > 1
            assert c.schedule != "zb-h2" or c.microbatches >= 2 * c.pp - 1
    default = calc.plan(cfg, capped, batch, n, micro_batches=(1,), zero_stage=(0, 1, 2, 3))
    assert default.best.schedule is None  # without `schedules`, the planner is unchanged


def test_planner_tries_the_v_schedules_and_agrees_with_the_brute_force():
    """ZBV and DualPipeV bring two chunks per rank (v = 2 whatever `virtual` says): on
    GPT-3 over 1024 GPUs their bubble, (p−1) half-stage units, beats ZB-H1's (p−1) whole
    ones, and the planner picks ZBV (DualPipeV ties: the same idle with F = B = W).
    Priced only where their closed forms hold: never with full recomputation."""
    cfg, cluster, n, batch, cap, _ = PLANS["gpt3-1024"]
    schedules = (*ALL, "zbv", "dualpipev")
    every = every_configuration(cfg, cluster, n, batch, cap, schedules=schedules)
    best = next(c for c in every if c.fits)
    capped = dataclasses.replace(cluster, memory=cap / 0.9)
    got = calc.plan(cfg, capped, batch, n, micro_batches=(1,), zero_stage=(0, 1, 2, 3),
                    schedules=schedules)
    chosen = got.best
    assert chosen.time.total == best.time.total and best.schedule in ("zbv", "dualpipev")
    key = (chosen.dp, chosen.pp, chosen.tp, chosen.schedule, chosen.virtual)
    assert key == (8, 16, 8, "zbv", 2)
    v_shaped = [c for c in got.candidates if c.schedule in ("zbv", "dualpipev")]
    assert v_shaped and all(c.virtual == 2 and c.recompute != "full" and c.zero_stage <= 1
                            for c in v_shaped)


def test_planner_prefers_zb_h2_with_full_recomputation_when_it_fits():
    """With full recomputation B = 2F (a MODEL): ZB-H2's step idles (p−1)F, ZB-H1's
    (p−1)·2F, so ZB-H2 wins where its 2p−1 microbatches fit."""
    cfg = gpt(2304, 24, 24)
    got = calc.plan(cfg, calc.A100_80GB, 512, 32, micro_batches=(1,), recompute=("full",),
                    schedules=ALL)
    pipelined = [c for c in got.candidates if c.pp > 1]
    assert pipelined[0].schedule == "zb-h2"
    only = calc.plan(cfg, calc.A100_80GB, 512, 32, micro_batches=(1,), recompute=("full",),
                     schedules=("zb-h2",))
    assert only.best.schedule == "zb-h2" and "schedule=zb-h2" in str(only.best)
    assert "bubble fraction (zb-h2, F = B = W, a MODEL)" in only.explain()


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_the_v_schedules_equal_simulate_with_unit_costs(p):
    """ZBV and DualPipeV (two chunks per rank in a V): the calculator's idle, stage idle
    and peak are what `simulate` counts from minitp's orders, with F = B = W."""
    for schedule, m in product(("zbv", "dualpipev"), (2 * p, 3 * p + 1)):
        for unit in (1, 2):
            sim = simulate(schedule, p, m, 2, costs=dict(F=unit, B=unit, W=unit))
            modelled = calc.pipeline_idle(schedule, p, m, 2, unit, unit, unit)
            assert modelled["idle"] == sim["ticks"] - sim["busy"] == (p - 1) * unit
            assert modelled["stage_idle"] == max(sim["inner_idle"])
            assert modelled["busy"] == sim["busy"]
        assert 2 * calc.microbatches_in_flight(p, m, schedule) == max(sim["peak"])


def test_the_v_schedules_are_modelled_only_where_their_order_is_tuned():
    with pytest.raises(ValueError, match="modelled for virtual=2 and t_f = t_b = t_w"):
        calc.pipeline_idle("zbv", 4, 8, 2, t_f=1, t_b=2, t_w=1)
    with pytest.raises(ValueError, match="'dualpipev' needs microbatches >= 2\\*pp = 8"):
        calc.microbatches_in_flight(4, 7, "dualpipev")
