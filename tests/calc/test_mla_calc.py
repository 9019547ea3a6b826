"""Latent attention in the calculator (`mt.calc.MLAShape`, `minitp.calc.architectures.mla`),
in-process: on minitp's layer the MODEL's parameters equal the module's, its FLOPs torch's
counter (the expanded form and decode's absorbed one), and so do the serving model's decode
(absorbed, through the cache) and prefill FLOPs (`mt.calc.decode_flops_per_token`,
`prefill_flops`); at DeepSeek-V3's published shape
(arXiv 2412.19437 §4.2) the parameters equal the hand count `mt.calc.DEEPSEEK_V3` carries,
the cache is (512 + 64)·61·2 bytes a token, whole on every tp rank, and attention data
parallelism holds 1/ranks of it; the activation model gives the GPT-style layer's terms plus
the latents', and the `ActivationLedger` measures it on minitp's layer with every byte of the
gap named by the Llama test's rules (`explain_gap`: CPU RMSNorm's float32 copies, rotary
tables, masks, ...), nothing unexplained, under no, selective and full recomputation.
(The trace's bytes beside `mla_tp_bytes_per_layer` and `mla_cp_bytes_per_layer`:
tests/tensor_parallel/test_mla_tp.py.)"""

import pytest
import torch
from test_llama_calc import explain_gap
from torch.utils.flop_counter import FlopCounterMode

import minitp as mt
from minitp.memory import ActivationLedger
from minitp.model.kv_cache import KVCache
from minitp.model.mla import set_absorbed
from minitp.recompute import apply_recompute
from minitp.rules import layer_label

V3 = mt.calc.DEEPSEEK_V3_MLA
_SIZES = dict(vocab_size=32, seq_len=8, n_layer=1, n_head=4, d_model=16, q_lora_rank=8,
              kv_lora_rank=8, rope_dim=4)
CFG = mt.GPTConfig.mla(**_SIZES)


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


def test_the_serving_models_decode_and_prefill_flops_are_torchs_count():
    """One cached decode step at 6 positions, absorbed; a 5-token prefill, expanded. The
    model counts 2 a norm weight and causal pairs P(P+1)/2; torch counts no elementwise
    norm and the written-out core's full P² (the mask applied after)."""
    torch.manual_seed(0)
    model = mt.GPT(mt.GPTConfig.mla(**{**_SIZES, "n_layer": 2})).double().eval()
    cfg = model.cfg
    norms = 2 * sum(p.numel() for n, p in model.named_parameters() if "norm" in n or ".ln" in n
                    or n.startswith("ln"))
    set_absorbed(model)
    cache = KVCache.for_model(model)
    with torch.no_grad(), cache.bound(model):
        model(torch.zeros(1, 5, dtype=torch.long))
        with FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, 1, dtype=torch.long))
    assert counter.get_total_flops() == mt.calc.decode_flops_per_token(cfg, 6) - norms
    set_absorbed(model, False)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long))
    masked = cfg.n_layer * cfg.n_head * 2 * (2 * cfg.head_dim + cfg.rope_dim) * (25 - 15)
    assert counter.get_total_flops() == mt.calc.prefill_flops(cfg, 5) - 5 * norms + masked


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


@pytest.mark.parametrize("recompute", [None, "selective", "full"])
def test_the_ledger_measures_the_activation_model_every_byte_of_the_gap_named(recompute):
    cfg = mt.GPTConfig.mla(vocab_size=16, seq_len=8, n_layer=2, n_head=8, d_model=32,
                           q_lora_rank=16, kv_lora_rank=16, rope_dim=4, dropout=0.1)
    torch.manual_seed(0)
    model = mt.GPT(cfg).to(torch.bfloat16)
    apply_recompute(model, recompute)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with ActivationLedger(model) as ledger:
        _, loss = model(x, x)
    del loss
    measured = ledger.per_layer()[layer_label(0)]
    gap = explain_gap(ledger.layer(layer_label(0)), 1, False)
    model_bytes = mt.calc.activation_bytes_per_layer(cfg, 2, recompute=recompute)
    assert measured - model_bytes - sum(gap.values()) == 0, (measured, model_bytes, gap)
