"""The two known bugs, measured: each lands far from the whole matrix's result; its fix
lands on it."""

import torch

from minitp.optim import traps

WRONG = 1e-2  # every measured error is far above float64's rounding, and the fix's below it


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_newton_schulz_on_a_partly_reduced_gradient_differs_on_every_rank():
    found = traps.partly_reduced([_randn(6, 4, seed=r) for r in range(2)])
    assert min(found["per_rank"]) > WRONG and found["spread"] > WRONG
    assert found["patchwork"] > WRONG and found["fixed"] < 1e-12


def test_replicas_stepped_from_partly_reduced_gradients_drift_apart():
    x, y = [_randn(5, 4, seed=r) for r in range(2)], [_randn(5, 6, seed=5 + r) for r in range(2)]
    errors = traps.drift(lambda w, r: x[r].T @ (x[r] @ w - y[r]), _randn(4, 6, seed=9), ranks=2)
    for rank in range(2):  # further from the correct copy at every step
        assert errors[0][rank] > WRONG / 10
        assert errors[0][rank] < errors[1][rank] < errors[2][rank]
    assert errors[-1][0] != errors[-1][1]  # and from each other


def test_newton_schulz_on_a_row_shard_is_not_the_whole_matrixs():
    found = traps.row_shard(_randn(8, 6), parts=2, dim=0)
    assert min(found["per_shard"]) > WRONG
