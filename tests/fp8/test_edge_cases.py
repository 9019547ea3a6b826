"""FP8's edge cases, against torchao's and TransformerEngine's rules: a scale for every finite
amax (torchao's amax_to_scale), and delayed scaling past a non-finite amax
(TransformerEngine's _default_sf_compute). One process, no ranks."""

import pytest
import torch

import minitp as mt
from minitp.fp8 import E4M3, E5M2, quantize, scale_from_amax

DTYPES = [torch.float32, torch.float64]
FORMATS = [E4M3, E5M2]


def _finite_amaxes(dtype):
    """0, the smallest subnormal, the smallest normal, the issue's 1e-37, torchao's floor,
    1, and the dtype's largest value."""
    info = torch.finfo(dtype)
    smallest = torch.tensor(0, dtype=dtype).nextafter(torch.tensor(1, dtype=dtype)).item()
    return [0.0, smallest, info.tiny, 1e-37, 1e-12, 1.0, info.max]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_finite_amax_has_a_positive_finite_scale(fmt, dtype):
    amax = torch.tensor(_finite_amaxes(dtype), dtype=dtype)
    scale = scale_from_amax(amax, fmt)
    assert scale.dtype == dtype
    assert scale.isfinite().all() and (scale > 0).all(), scale.tolist()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_cast_of_zeros_beside_any_finite_amax_reads_back_finite(fmt, dtype):
    """[amax, -amax/3, 0] for each finite amax: no NaN from 0 times an infinite scale, and no
    inf from reading the format's max back at the dtype's largest amax."""
    for amax in _finite_amaxes(dtype):
        x = torch.tensor([amax, -amax / 3, 0.0], dtype=dtype)
        q = quantize(x, scale_from_amax(x.abs().max(), fmt), fmt)
        assert q.isfinite().all(), (amax, q.tolist())


def test_the_issues_tensor_casts_to_zeros():
    """torch.tensor([1e-37, 0.0]) cast to [0., nan] before the floor."""
    x = torch.tensor([1e-37, 0.0])
    assert quantize(x, scale_from_amax(x.abs().max(), E4M3), E4M3).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_scale_is_torchaos_max_over_amax_floored_at_1e_12(dtype):
    """torchao: float8_max / clamp(amax.to(float64), min=1e-12)."""
    amax = torch.tensor([1e-37, 1e-13, 2.0, 3.0], dtype=dtype)
    wide = amax.to(torch.float64).clamp_min(1e-12)
    assert torch.equal(scale_from_amax(amax, E4M3), (448.0 / wide).to(dtype))


def test_a_float32_fp8_linear_has_finite_gradients_for_a_tiny_output_gradient():
    """The issue's case: an output gradient around 1e-35 beside exact zeros gave NaNs in
    every gradient of a float32 Fp8Linear (the e5m2 scale overflowed)."""
    g = torch.Generator().manual_seed(0)
    layer = mt.fp8.Fp8Linear(4, 3)
    layer.fp8 = mt.fp8.LayerScales("tensorwise")
    x = torch.randn(5, 4, generator=g, requires_grad=True)
    grad = torch.zeros(5, 3)
    grad[:2] = 1e-35 * torch.randn(2, 3, generator=g)
    layer(x).backward(grad)
    for name, t in (("x", x.grad), ("weight", layer.weight.grad), ("bias", layer.bias.grad)):
        assert t.isfinite().all(), name


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_tensorwise_casts_a_tensor_holding_inf_or_nan_to_nan(bad):
    """No scale fits a non-finite amax: the cast is all NaN, the value is not hidden."""
    scale = mt.fp8.TensorScale("tensorwise", E4M3)
    assert scale.cast(torch.tensor([1.0, bad, 0.0], dtype=torch.float64)).isnan().all()


def _delayed_run(amaxes, history_len=3):
    """Cast [amax, amax/4] for each amax with delayed scaling: (scale, output) per cast."""
    scale = mt.fp8.TensorScale("delayed", E4M3, history_len=history_len)
    casts = []
    for amax in amaxes:
        out = scale.cast(torch.tensor([amax, amax / 4], dtype=torch.float64))
        casts.append((scale.last_scale.item(), out))
    return scale, casts


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_delayed_keeps_the_previous_scale_while_a_non_finite_amax_is_in_the_window(bad):
    """2, 4, bad, then 1s, window 3: cast 3 scales by max(2, 4); casts 4-6 see the bad amax
    in their window and keep 448/4 (TransformerEngine's where(isfinite(amax), sf, scale));
    cast 7's window is 1s again: 448."""
    _, casts = _delayed_run([2.0, 4.0, bad, 1.0, 1.0, 1.0, 1.0])
    assert [s for s, _ in casts] == [224.0, 224.0, 112.0, 112.0, 112.0, 112.0, 448.0]


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_delayed_casts_finite_values_finitely_after_a_non_finite_amax(bad):
    _, casts = _delayed_run([2.0, 4.0, bad, 1.0, 1.0, 1.0, 1.0])
    assert all(out.isfinite().all() for _, out in casts[3:])


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_delayed_records_a_non_finite_amax_as_it_is(bad):
    """As TransformerEngine's history: the value rolls through the window unchanged."""
    scale, _ = _delayed_run([2.0, bad, 1.0])
    torch.testing.assert_close(torch.stack(scale.history),
                               torch.tensor([2.0, bad, 1.0], dtype=torch.float64),
                               rtol=0, atol=0, equal_nan=True)


def test_delayed_keeps_the_previous_scale_on_a_zero_window():
    """TransformerEngine's where(amax > 0, sf, scale): an all-zero window keeps the scale."""
    _, casts = _delayed_run([2.0, 0.0, 0.0], history_len=1)
    assert [s for s, _ in casts] == [224.0, 224.0, 224.0]


def test_delayed_starts_from_scale_1_on_a_non_finite_first_amax():
    """No history and no previous scale: TransformerEngine's initial scale, 1."""
    _, casts = _delayed_run([float("inf")])
    assert casts[0][0] == 1.0
