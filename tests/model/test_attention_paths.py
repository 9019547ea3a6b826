"""GPTConfig(attention="math" | "sdpa"): the fused kernel computes the same model in
float64 and keeps none of the s×s tensors the written-out core keeps for backward.

The parallel meshes with sdpa are in test_3d (some of its settings use it)."""

import pytest
import torch

import minitp as mt
from minitp.memory import ActivationLedger

CFG = dict(vocab_size=40, seq_len=16, n_layer=2, n_head=4, d_model=32)


def _pair(dtype=torch.float64):
    torch.manual_seed(0)
    math_model = mt.GPT(mt.GPTConfig(**CFG)).to(mt.device(), dtype)
    sdpa_model = mt.GPT(mt.GPTConfig(**CFG, attention="sdpa")).to(mt.device(), dtype)
    sdpa_model.load_state_dict(math_model.state_dict())
    return math_model, sdpa_model


def _batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CFG["vocab_size"], (3, CFG["seq_len"]), generator=g)
    y = torch.randint(0, CFG["vocab_size"], (3, CFG["seq_len"]), generator=g)
    return x.to(mt.device()), y.to(mt.device())


def test_sdpa_equals_math_in_float64_loss_and_every_gradient():
    math_model, sdpa_model = _pair()
    x, y = _batch()
    losses = []
    for model in (math_model, sdpa_model):
        _, loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)
    for (name, p), q in zip(math_model.named_parameters(), sdpa_model.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max().item() < 1e-12, name


def _core_entries(model, x, y):
    with ActivationLedger(model) as ledger:
        model(x, y)
    return [e for e in ledger.entries if e.module.endswith("attn.core")], ledger


def test_the_fused_kernel_keeps_no_s_by_s_tensor_the_5as_over_h_term_is_gone():
    math_model, sdpa_model = _pair()
    x, y = _batch()
    s, a, b = CFG["seq_len"], CFG["n_head"], x.shape[0]
    math_core, math_ledger = _core_entries(math_model, x, y)
    sdpa_core, sdpa_ledger = _core_entries(sdpa_model, x, y)
    square = [e for e in math_core if e.shape[-2:] == (s, s) and e.nbytes]
    # written out: the softmax's probabilities, a·s²·b float64 numbers per layer (no
    # dropout here, so no mask: 8 of Korthikanti's 5as²b-in-16-bit bytes' worth)
    assert sum(e.nbytes for e in square if e.dtype == "float64") == (
        CFG["n_layer"] * a * s * s * b * 8)
    assert not [e for e in sdpa_core if e.shape[-2:] == (s, s)], sdpa_core
    # fused: q, k and v (one qkv storage), the output and one log-sum-exp per row, all
    # linear in s: 8·b·s·(4h + a) bytes per layer
    h = CFG["d_model"]
    for layer in ("layer0", "layer1"):
        kept = sum(e.nbytes for e in sdpa_core if e.layer == layer)
        assert kept == 8 * b * s * (4 * h + a), sdpa_ledger.table(layer)
    assert sdpa_ledger.total_bytes < math_ledger.total_bytes


@pytest.mark.parametrize("kwargs, message", [
    (dict(attention="flash"), "attention must be one of ('math', 'sdpa')"),
    (dict(attention="sdpa", dropout=0.1), "draws its dropout masks inside the fused kernel"),
])
def test_bad_attention_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        mt.GPTConfig(**CFG, **kwargs)


@pytest.mark.parametrize("size", [0, -2, 2.0, True, "4"])
def test_a_size_that_is_not_a_positive_int_is_refused(size):
    """GPTConfig's sizes go through the one positive-int rule (rules.check_positive_int):
    a bool is not a size, though Python counts it an int."""
    with pytest.raises(ValueError, match="GPTConfig.n_layer must be a positive integer, got"):
        mt.GPTConfig(**{**CFG, "n_layer": size})
