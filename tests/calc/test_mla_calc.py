"""Latent attention in the calculator (`mt.calc.MLAShape`, `minitp.calc.architectures.mla`),
in-process: on minitp's layer the MODEL's parameters equal the module's, its FLOPs torch's
counter (the expanded form and decode's absorbed one); at DeepSeek-V3's published shape
(arXiv 2412.19437 §4.2) the parameters equal the hand count `mt.calc.DEEPSEEK_V3` carries,
the cache is (512 + 64)·61·2 bytes a token, whole on every tp rank, and attention data
parallelism holds 1/ranks of it; the activation model gives the GPT-style layer's terms plus
the latents'. (The trace's bytes beside `mla_tp_bytes_per_layer` and `mla_cp_bytes_per_layer`:
tests/tensor_parallel/test_mla_tp.py.)"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import minitp as mt
from minitp.model.mla import set_absorbed

V3 = mt.calc.DEEPSEEK_V3_MLA
CFG = mt.GPTConfig.mla(vocab_size=32, seq_len=8, n_layer=1, n_head=4, d_model=16,
                       q_lora_rank=8, kv_lora_rank=8, rope_dim=4)


def _attention_flops(model, x) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.blocks[0].attn(x)
    return counter.get_total_flops()


def test_minitps_layer_is_the_model_params_and_flops_both_forms():
    torch.manual_seed(0)
    model = mt.GPT(CFG).double()
    shape = mt.calc.MLAShape.of(CFG)
    held = sum(p.numel() for p in model.blocks[0].attn.parameters())
    assert mt.calc.mla_params(shape)["total"] == held
    x = torch.randn(2, CFG.seq_len, CFG.d_model, dtype=torch.float64)
    rows = 2 * CFG.seq_len  # every query meets every key: the written-out core masks, not skips
    assert _attention_flops(model, x) == rows * mt.calc.mla_flops_per_token(shape, CFG.seq_len)
    set_absorbed(model)
    assert _attention_flops(model, x) == rows * mt.calc.mla_flops_per_token(
        shape, CFG.seq_len, "absorbed")


def test_deepseek_v3_at_its_published_shape():
    params = mt.calc.mla_params(V3)
    assert params["total"] == mt.calc.DEEPSEEK_V3.attention_params == 187_107_328
    assert params["replicated"] == 7168 * (1536 + 512 + 64) + 1536 + 512  # on every tp rank
    token = mt.calc.mla_cache_bytes_per_token(V3.kv_lora_rank, V3.rope_dim, V3.n_layer)
    assert token == 576 * 61 * 2 == 70_272  # bf16, every layer
    held = mt.calc.attention_dp_cache_bytes(mt.calc.DEEPSEEK_V3_LATENT, 64, 4096, 8)
    assert held["tp"] == 64 * 4096 * token and held["attention_dp"] == 8 * 4096 * token
    assert held["ratio"] == 8.0
    # decode at 4K keys: absorbed reads the 576-wide latent per head, expanded 192 + 128
    expanded, absorbed = (mt.calc.mla_flops_per_token(V3, 4096, form)
                          for form in ("expanded", "absorbed"))
    assert absorbed - expanded == (2 * 128 * (576 + 512 - 320) * 4096
                                   - 2 * 512 * 2 * 128 * 128 + 2 * 2 * 128 * 128 * 512)
    bytes_ = mt.calc.mla_tp_bytes_per_layer(V3, 4096, 1, 8, sp=True)
    assert bytes_["partial_grads"] == (params["replicated"] + 2 * 7168) * 2
    cp = mt.calc.mla_cp_bytes_per_layer(V3, 4096, 1, tp=8)
    assert cp["heads"] == 16 * 320 * 4096 * 2 and cp["latent"] == 576 * 4096 * 2


def test_activation_bytes_are_the_gpt_terms_plus_the_latents():
    """At tp 2 with SP: 10sbh/t + 2sbh/t (W^O's input) + 8sbf/t (SwiGLU) + the MLA terms."""
    s, b, h, t = CFG.seq_len, 1, CFG.d_model, 2
    terms = mt.calc.mla_activation_bytes_per_layer(mt.calc.MLAShape.of(CFG), s, b, t)
    assert terms["latents"] == 2 * s * b * (2 * 8 + 2 * 8)  # norms' inputs, up-projections'
    assert terms["q"] == 2 * s * b * 4 * (4 + 4) / t
    whole = mt.calc.activation_bytes_per_layer(CFG, b, t, sp=True)
    rest = 10 * s * b * h / t + 2 * s * b * h / t + 8 * s * b * CFG.ffn_width / t
    assert whole == rest + sum(terms.values())
    selective = mt.calc.mla_activation_bytes_per_layer(mt.calc.MLAShape.of(CFG), s, b, t,
                                                       "selective")
    assert selective["probabilities"] == selective["dropout"] == 0
    with pytest.raises(ValueError, match="gathering its latent"):
        mt.calc.mla_activation_bytes_per_layer(V3, 4096, 1, cp=2, cp_comm="ring")
    with pytest.raises(ValueError, match="form must be"):
        mt.calc.mla_flops_per_token(V3, 8, "folded")
