"""The emulated FP8 casts and the FP8 linear layer, on one process (no ranks)."""

import copy

import pytest
import torch

import minitp as mt
from minitp.fp8 import E4M3, E5M2, LayerScales, quantize, representable, scale_from_amax


def _values(n=1000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_a_cast_is_idempotent(fmt):
    x = _values() * 3
    scale = scale_from_amax(x.abs().max(), fmt)
    once = quantize(x, scale, fmt)
    assert torch.equal(quantize(once, scale, fmt), once)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_values_round_to_the_nearest_representable_value(fmt):
    grid = representable(fmt)
    x = _values() * fmt.max / 8  # spread over the range, not only near 1
    q = x.to(fmt.dtype).to(torch.float64)
    assert torch.isin(q, grid).all()
    nearest = (x[:, None] - grid[None, :]).abs().min(dim=1).values
    assert torch.equal((x - q).abs(), nearest)  # ties aside, nearest is unique


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_amax_maps_to_the_format_max(fmt):
    x = _values()
    scale = scale_from_amax(x.abs().max(), fmt)
    scaled = (x * scale).to(fmt.dtype).to(torch.float64)
    assert scaled.abs().max().item() == fmt.max


def test_the_emulated_matmul_is_the_hand_computed_one():
    """x = [[1, 0.3]], W = [[2, -1]]: tensorwise e4m3, scale 448/amax. x·448 = [448, 134.4]:
    134.4 lies between 128 and 144 (e4m3 steps by 16 there) and rounds to 128, so x_q =
    [1, 128/448]; W·224 = [448, −224], exact, W_q = W. y = 2 − 128/448."""
    x = torch.tensor([[1.0, 0.3]], dtype=torch.float64)
    w = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    scales = LayerScales("tensorwise")
    y = scales.linear(scales.cast_input(x), w, None, lambda a, b, bias: a @ b.T)
    assert y.item() == 2.0 - 128.0 / 448.0


def test_backward_casts_the_output_gradient_to_e5m2():
    """∂x = g_q W_q and ∂W = g_qᵀ x_q, g_q the output gradient cast to e5m2."""
    torch.manual_seed(0)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(5, 3, dtype=torch.float64)
    scales = LayerScales("tensorwise")
    scales.linear(scales.cast_input(x), w, None, lambda a, b, bias: a @ b.T).backward(g)
    gq = quantize(g, scale_from_amax(g.abs().max(), E5M2), E5M2)
    xq = quantize(x.detach(), scale_from_amax(x.abs().max(), E4M3), E4M3)
    wq = quantize(w.detach(), scale_from_amax(w.abs().max(), E4M3), E4M3)
    assert torch.equal(x.grad, gq @ wq)
    assert torch.equal(w.grad, gq.T @ xq)


def test_delayed_scales_by_the_history_before_this_cast():
    scale = mt.fp8.TensorScale("delayed", E4M3, history_len=2)
    for amax in (1.0, 4.0, 2.0):
        scale.cast(torch.tensor([amax], dtype=torch.float64))
    assert scale.last_scale.item() == 448.0 / 4.0  # max of (1, 4), not this cast's 2
    assert [a.item() for a in scale.history] == [4.0, 2.0]


def test_rowwise_gives_each_row_its_scale():
    x = torch.tensor([[1.0, 0.5], [100.0, 3.0]], dtype=torch.float64)
    scale = mt.fp8.TensorScale("rowwise", E4M3)
    scale.cast(x)
    assert scale.last_scale.flatten().tolist() == [448.0, 4.48]


def test_fp8_changes_the_model_and_is_deterministic():
    """Not vacuous: the FP8 model's loss differs from the plain one's, and two FP8 runs agree."""
    cfg = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=16)
    torch.manual_seed(0)
    plain = mt.GPT(cfg).double()
    x = torch.randint(0, 16, (4, 8))
    fp8 = mt.fp8.convert(copy.deepcopy(plain), "tensorwise")
    again = mt.fp8.convert(copy.deepcopy(plain), "tensorwise")
    assert abs(fp8(x, x)[1].item() - plain(x, x)[1].item()) > 1e-6
    assert fp8(x, x)[1].item() == again(x, x)[1].item()
