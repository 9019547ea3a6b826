"""Newton–Schulz in float64 is the quintic applied to the singular values: an independent
reference through the SVD (X = USVᵀ, so every iterate is U p(S) Vᵀ)."""

import pytest
import torch

from minitp.optim import newton_schulz
from minitp.optim.newton_schulz import NS_COEFFICIENTS, NS_STEPS, adjusted_lr


def _through_the_svd(g):
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    s = s / g.norm()
    a, b, c = NS_COEFFICIENTS
    for _ in range(NS_STEPS):
        s = a * s + b * s ** 3 + c * s ** 5
    return u @ torch.diag(s) @ vh


@pytest.mark.parametrize("shape", [(8, 8), (24, 8), (8, 32)])
def test_float64_newton_schulz_is_the_quintic_of_the_singular_values(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert (newton_schulz(g) - _through_the_svd(g)).abs().max() < 1e-12


def test_a_non_matrix_is_refused_in_one_line():
    with pytest.raises(ValueError, match="2-D matrix"):
        newton_schulz(torch.ones(3))


def test_the_lr_adjustments_are_torchs():
    assert adjusted_lr(1.0, None, (32, 8)) == 2.0  # √(32/8)
    assert adjusted_lr(1.0, "original", (8, 32)) == 1.0
    assert adjusted_lr(1.0, "match_rms_adamw", (8, 25)) == pytest.approx(1.0)  # 0.2·√25
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        adjusted_lr(1.0, "rms", (8, 8))
