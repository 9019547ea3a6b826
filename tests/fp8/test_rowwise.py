"""Rowwise FP8 is torchao's ROWWISE recipe (torchao/float8/config.py): every operand in e4m3,
gradients included, every scale rounded down to a power of two, and a backward that casts
each operand again along the axis its GEMM keeps (torchao/float8/float8_linear.py,
matmul_with_hp_or_float8_args), recomputed here by hand from torch's e4m3. One process."""

import torch

from minitp.fp8 import E4M3, E5M2, LayerScales
from minitp.tensor_parallel.weight_grad import DeferredWeightGrads

MAX = torch.finfo(torch.float8_e4m3fn).max


def _cast(t, dims):
    """t in e4m3, one power-of-two scale per slice, the amax over `dims` (torchao's
    amax_to_scale with round_scales_to_power_of_2)."""
    amax = t.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12)
    scale = torch.exp2(torch.floor(torch.log2(MAX / amax)))
    return (t * scale).clamp(-MAX, MAX).to(torch.float8_e4m3fn).double() / scale


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    x[0, 1] *= 300.0  # an outlier token, so a per-token and a per-feature scale differ
    w = torch.randn(6, 4, generator=g, dtype=torch.float64)
    return x, w, torch.randn(2, 3, 6, generator=g, dtype=torch.float64)


def test_rowwise_forward_and_backward_are_torchaos_casts():
    x, w, g = _tensors()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    scales = LayerScales("rowwise")
    y = scales.linear(scales.cast_input(xr), wr, None, None)
    y.backward(g)
    assert torch.equal(y, _cast(x, -1) @ _cast(w, -1).T)
    assert torch.equal(xr.grad, _cast(g, -1) @ _cast(w, 0))  # dgrad: W per input column
    rows = (0, 1)  # wgrad: g and x per feature, the amax over every token
    assert torch.equal(wr.grad, (_cast(g, rows).reshape(-1, 6).T @ _cast(x, rows).reshape(-1, 4)))


def test_rowwise_casts_gradients_to_e4m3_and_hybrid_to_e5m2():
    assert {s.fmt for s in LayerScales("rowwise").scales.values()} == {E4M3}
    assert LayerScales("tensorwise").grad.fmt == E5M2 and LayerScales("delayed").grad.fmt == E5M2


def test_rowwise_scales_are_powers_of_two_below_max_over_amax():
    x = torch.tensor([[1.0, 0.5], [100.0, 3.0]], dtype=torch.float64)
    scales = LayerScales("rowwise")
    scales.input.cast(x)
    assert scales.input.last_scale.flatten().tolist() == [256.0, 4.0]  # 448, 4.48 rounded down


def test_a_deferred_weight_gradient_is_the_same_recast():
    """A zero-bubble pipeline's W pass multiplies the two casts B stored: the same ∂W."""
    x, w, g = _tensors(1)
    layer = type("Layer", (), {"weight_grads": None})()
    grads = []
    for store in (None, DeferredWeightGrads()):
        layer.weight_grads, weight = store, w.clone().requires_grad_()
        scales = LayerScales("rowwise")
        scales.linear(x.clone().requires_grad_(), weight, None, None, layer).backward(g)
        if store is not None:
            assert weight.grad is None  # B left it to W
            store.run()
        grads.append(weight.grad)
    assert torch.equal(*grads)

