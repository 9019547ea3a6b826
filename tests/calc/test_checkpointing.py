"""minitp.calc.reliability.checkpointing (issue 42): how often to save. Young's interval is
the minimum of its own first-order cost, found here by search; Daly's is set beside the
minimum of the exact expected run time under Poisson failures, computed here from its
renewal sum; the Llama 3 failure rate is recomputed from the paper's counts."""

import math

import pytest

import minitp.calc as calc


def _argmin(f, lo, hi, iters=200):
    """Golden-section search for the minimum of a unimodal f on [lo, hi]."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    for _ in range(iters):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(c) < f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def _wall_per_work(tau, save, mtbf):
    """Expected wall seconds per second of work, simulated as a sum: a segment of
    t = tau + save is retried until no failure lands in it; the k-th try fails with
    probability p = 1 - exp(-t/M) and then costs the mean time to that failure."""
    t = tau + save
    p = -math.expm1(-t / mtbf)
    lost_per_failure = mtbf - t * (1 - p) / p  # E[x | x < t] for an exponential
    return (t + p / (1 - p) * lost_per_failure) / tau


def test_youngs_interval_is_the_minimum_of_the_first_order_cost():
    for save, mtbf in ((30.0, 3 * 3600.0), (300.0, 86400.0), (1.0, 600.0)):
        found = _argmin(lambda t, s=save, m=mtbf: calc.lost_fraction(t, s, m), 1e-3, 10 * mtbf)
        assert math.isclose(calc.young_interval(save, mtbf), found, rel_tol=1e-6)
        assert math.isclose(found, math.sqrt(2 * save * mtbf), rel_tol=1e-6)


@pytest.mark.parametrize("ratio", [1e-3, 1e-2, 0.1, 0.5])
def test_daly_is_near_the_exact_minimum_and_no_worse_than_young(ratio):
    mtbf = 3 * 3600.0
    save = ratio * mtbf
    exact = _argmin(lambda t: _wall_per_work(t, save, mtbf), 1e-6 * mtbf, 10 * mtbf)
    best = _wall_per_work(exact, save, mtbf)
    daly, young = calc.daly_interval(save, mtbf), calc.young_interval(save, mtbf)
    assert _wall_per_work(daly, save, mtbf) <= best * (1 + 1e-3)
    assert _wall_per_work(daly, save, mtbf) <= _wall_per_work(young, save, mtbf) * (1 + 1e-9)
    # the module's closed form is the same expectation as the sum above
    assert math.isclose(calc.expected_seconds(exact, exact, save, mtbf), best * exact,
                        rel_tol=1e-9)


def test_daly_saves_every_mtbf_once_a_save_takes_twice_the_mtbf():
    assert calc.daly_interval(2.0, 1.0) == 1.0 and calc.daly_interval(5.0, 1.0) == 1.0


def test_llama3_failures_give_a_three_hour_mtbf_for_the_whole_job():
    record = calc.LLAMA3_405B
    assert (record.failures, record.units, record.hours) == (419, 16384, 1296)
    mtbf_h = calc.job_mtbf_seconds(record.units, record.rate_per_unit_hour) / 3600
    assert math.isclose(mtbf_h, 54 * 24 / 419, rel_tol=1e-12)  # 3.09 h
    # 4 GB per GPU to 2 TB/s (§3.3.1): a 32.8 s save, and about a quarter of an hour of work
    plan = calc.save_plan(16384 * 4e9, 2e12, 16384, record.rate_per_unit_hour)
    assert math.isclose(plan.save_s, 32.768)
    assert 800 < plan.daly_s < plan.young_s < 900


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="must be positive"):
        calc.young_interval(0.0, 10.0)
    with pytest.raises(ValueError, match="positive bandwidth"):
        calc.save_seconds(1e9, 0)
    with pytest.raises(ValueError, match="units must be positive"):
        calc.failure_rate(3, 0, 10.0)
