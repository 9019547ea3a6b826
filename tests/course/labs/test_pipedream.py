"""PipeDream (asynchronous 1F1B, weight stashing) and PipeDream-Flush, on real processes
(`minitp.course.labs.pipedream`), each against a single-device reference written here, in float64.

* The flush is synchronous SGD: equal to plain training of the whole stack, step by step.
* The asynchronous run is PipeDream's update rule (Narayanan et al. 2019, weight stashing): stage s
  of p computes microbatch i's gradient — forward *and* backward — with its weights after
  max(0, i − (p − s − 1)) updates, and applies it to its newest weights. The reference
  below computes exactly that on one device, in one autograd graph per microbatch,
  without any schedule; the real run must match it to float64 rounding. Without weight
  stashing (the backward uses the newest weights) it must not.
* Weight versions alive at once, counted on each stage: p − s with stashing, 1 with a flush.
* Staleness, measured at each backward: the relative distance between the weights the
  gradient was computed on and those it updates, as the reference's versions give it; 0 on
  the last stage and everywhere under a flush.
"""

import pytest
import torch

from minitp.course.labs import pipedream as pd

SETUP = pd.Setup(p=3, steps=4, microbatches=4, lr=0.5)


def _plain_sgd(setup):
    """The stack on one device, one SGD step per m microbatches (their mean loss)."""
    weights = [w.clone().requires_grad_() for stage in pd.initial_weights(setup) for w in stage]
    xs, ys = pd.data(setup)
    k, m = 2 * setup.layers, setup.microbatches
    for step in range(setup.steps):
        loss = 0
        for i in range(step * m, (step + 1) * m):
            h = xs[i]
            for s in range(setup.p):
                h = pd.stage_forward(weights[s * k:(s + 1) * k], h, s == setup.p - 1)
            loss = loss + ((h - ys[i]) ** 2).mean() / m
        grads = torch.autograd.grad(loss, weights)
        weights = [(w - setup.lr * g).detach().requires_grad_()
                   for w, g in zip(weights, grads, strict=True)]
    return [weights[s * k:(s + 1) * k] for s in range(setup.p)]


def _pipedream_rule(setup):
    """PipeDream's rule, no schedule: every version of every stage, W_s^(0), W_s^(1), …;
    microbatch i runs on (W_0^(d_0(i)), …, W_{p−1}^(d_{p−1}(i))), d_s(i) = max(0, i − p + s + 1),
    and W_s^(i+1) = W_s^(i) − (lr/m) · its gradient. Returns the final weights and, per stage,
    the mean of ‖W_s^(d_s(i)) − W_s^(i)‖ / ‖W_s^(i)‖ over the stream."""
    versions = [[[w.clone() for w in stage]] for stage in pd.initial_weights(setup)]
    xs, ys = pd.data(setup)
    p = setup.p
    gaps = [[] for _ in range(p)]
    for i in range(setup.stream):
        for s in range(p):
            old, new = (torch.cat([w.flatten() for w in versions[s][j]])
                        for j in (max(0, i - p + s + 1), -1))
            gaps[s].append(torch.linalg.vector_norm(old - new) / torch.linalg.vector_norm(new))
        used = [[w.clone().requires_grad_() for w in versions[s][max(0, i - p + s + 1)]]
                for s in range(p)]
        h = xs[i]
        for s in range(p):
            h = pd.stage_forward(used[s], h, s == p - 1)
        grads = torch.autograd.grad(((h - ys[i]) ** 2).mean(), [w for ws in used for w in ws])
        k = 2 * setup.layers
        for s in range(p):
            newest = versions[s][-1]
            versions[s].append([w - setup.lr / setup.microbatches * g
                                for w, g in zip(newest, grads[s * k:(s + 1) * k], strict=True)])
    return [v[-1] for v in versions], [float(sum(g) / len(g)) for g in gaps]


def _largest_difference(a, b):
    return max((x - y).abs().max().item() for xs, ys in zip(a, b, strict=True)
               for x, y in zip(xs, ys, strict=True))


@pytest.fixture(scope="module")
def runs():
    return {mode: pd.run(mode, SETUP, timeout=60) for mode in pd.MODES}


def test_flush_is_plain_synchronous_sgd(runs):
    assert _largest_difference(runs["flush"].weights, _plain_sgd(SETUP)) < 1e-12
    losses, weights = pd.single_device(SETUP)  # the lab's own reference, used by lesson 11
    assert max(abs(a - b) for a, b in zip(losses, runs["flush"].losses, strict=True)) < 1e-12
    assert _largest_difference(runs["flush"].weights, [weights[0:4], weights[4:8],
                                                       weights[8:12]]) < 1e-12


def test_async_is_pipedreams_update_rule(runs):
    reference, _ = _pipedream_rule(SETUP)
    assert _largest_difference(runs["async"].weights, reference) < 1e-12
    # it is not synchronous SGD, and without stashing it is not PipeDream's rule either
    assert _largest_difference(runs["async"].weights, _plain_sgd(SETUP)) > 1e-6
    assert _largest_difference(runs["async-no-stash"].weights, reference) > 1e-6


def test_weight_versions_alive(runs):
    p, bytes_per_version = SETUP.p, runs["async"].stage_bytes[0]
    assert bytes_per_version == 2 * (SETUP.width ** 2 + SETUP.width) * 8  # float64
    assert runs["async"].versions == [p - s for s in range(p)] == runs["async"].model_versions()
    assert runs["async"].version_bytes == [(p - s) * bytes_per_version for s in range(p)]
    assert runs["flush"].versions == [1] * p == runs["flush"].model_versions()
    assert runs["async-no-stash"].versions == [1] * p


def test_staleness_measured(runs):
    _, reference = _pipedream_rule(SETUP)
    assert max(abs(a - b) for a, b in zip(runs["async"].staleness, reference, strict=True)) < 1e-12
    assert runs["async"].staleness[-1] == 0 and min(runs["async"].staleness[:-1]) > 1e-3
    assert runs["flush"].staleness == [0.0] * SETUP.p
