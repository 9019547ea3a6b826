"""Multi-head latent attention (`GPTConfig.mla`, `minitp.model.mla`), in float64, in-process:
the layer is DeepSeek-V2's equations 9–19 written out here head by head from its weights; the
absorbed form (W^UK into the query, W^UV into the output) is the same function, forward and
backward; cached greedy decoding through `minitp.serving.generate` equals uncached, both
forms, both attention cores; the cache holds the latent and the shared rotary key only,
(kv_lora_rank + rope_dim)·layers·bytes a token, whatever the heads; packed documents restart
their rotary positions; the calculator counts its parameters and FLOPs; bad sizes get one line."""

import math

import pytest
import torch

import minitp as mt
from minitp.model.kv_cache import KVCache
from minitp.model.mla import LatentAttention, set_absorbed
from minitp.serving import generate

SMALL = dict(vocab_size=64, seq_len=12, n_layer=2, n_head=4, d_model=32)
CONFIGS = {
    "q-latent": mt.GPTConfig.mla(**SMALL, q_lora_rank=16, kv_lora_rank=12, rope_dim=6),
    "no-q-latent-sdpa": mt.GPTConfig.mla(**SMALL, attention="sdpa"),
}


def _model(cfg):
    torch.manual_seed(0)
    return mt.GPT(cfg).double().eval()


def _rope(x, positions, theta=10000.0):
    """RoPE by halves, as minitp's `Rotary` (x: (..., T, d))."""
    d = x.shape[-1]
    angles = positions[:, None] * theta ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def _equations(layer: LatentAttention, h: torch.Tensor, cfg) -> torch.Tensor:
    """DeepSeek-V2 (arXiv 2405.04434) eqs. 9–19, head by head, causal."""
    T, hs, r, n = h.shape[1], cfg.head_dim, cfg.rope_dim, cfg.n_head
    pos = torch.arange(T, dtype=h.dtype)
    c_kv = layer.kv_norm(h @ layer.kv_down.weight.T)  # eq. 9, then V2 §3.1.2's RMSNorm
    c_q = layer.q_norm(h @ layer.q_down.weight.T) if cfg.q_lora_rank else h  # eq. 12
    w_q = layer.q_up.weight.view(n, hs + r, -1)  # [W^UQ_i; W^QR_i]
    w_kv = layer.kv_up.weight.view(n, 2, hs, -1)  # [W^UK_i; W^UV_i]
    k_r = _rope(h @ layer.k_rope.weight.T, pos)  # eq. 15: one for all heads
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    outs = []
    for i in range(n):
        q = torch.cat([c_q @ w_q[i, :hs].T, _rope(c_q @ w_q[i, hs:].T, pos)], -1)  # 13, 14, 16
        k = torch.cat([c_kv @ w_kv[i, 0].T, k_r], -1)  # eqs. 10, 17
        v = c_kv @ w_kv[i, 1].T  # eq. 11
        scores = (q @ k.transpose(-2, -1) / math.sqrt(hs + r)).masked_fill(~mask, -math.inf)
        outs.append(scores.softmax(-1) @ v)  # eq. 18
    return torch.cat(outs, -1) @ layer.proj.weight.T  # eq. 19


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_layer_is_the_papers_equations_and_absorption_is_the_same_function(name):
    cfg = CONFIGS[name]
    layer = _model(cfg).blocks[0].attn
    generator = torch.Generator().manual_seed(2)
    h = torch.randn(2, 9, cfg.d_model, dtype=torch.float64, generator=generator).requires_grad_()
    expanded = layer(h)
    assert (expanded - _equations(layer, h, cfg)).abs().max() < 1e-13
    grads = torch.autograd.grad(expanded.square().sum(), [h, *layer.parameters()])
    layer.absorb = True
    absorbed = layer(h)
    assert (absorbed - expanded).abs().max() < 1e-13
    again = torch.autograd.grad(absorbed.square().sum(), [h, *layer.parameters()])
    assert max(float((a - b).abs().max()) for a, b in zip(grads, again, strict=True)) < 1e-12


@pytest.mark.parametrize("name, absorb", [("q-latent", True), ("no-q-latent-sdpa", False)])
def test_cached_greedy_decoding_equals_uncached(name, absorb):
    """Prompt 5 + 9 tokens: past the window's end (12), where the window re-prefills. Sampled:
    each form with one of the configurations (the layer test covers both forms in both)."""
    model = _model(CONFIGS[name])
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    plain = generate(model, prompt, 9, cached=False)  # the expanded form, no cache
    set_absorbed(model, absorb)
    cached = generate(model, prompt, 9)
    assert torch.equal(cached.tokens, plain.tokens)
    diff = max(float((a - b).abs().max()) for a, b in zip(cached.logits, plain.logits, strict=True))
    assert diff <= 1e-12, diff


def test_the_cache_holds_the_latent_and_the_rotary_key_whatever_the_heads():
    """(kv_lora_rank + rope_dim) · layers · 8 bytes (float64) a token, measured from the
    tensors, at 4 heads and at 8: GQA's 2·layers·kv_heads·head_dim grows with the heads."""
    for heads in (4, 8):
        cfg = mt.GPTConfig.mla(**{**SMALL, "n_head": heads}, kv_lora_rank=12, rope_dim=6)
        model = _model(cfg)
        cache = KVCache.for_model(model)
        with torch.no_grad(), cache.bound(model):
            model(torch.zeros(3, 4, dtype=torch.long))
        assert cache.bytes_per_token() == (12 + 6) * cfg.n_layer * 8
        assert cache.bytes_per_token() == mt.calc.mla_cache_bytes_per_token(12, 6, 2, 8)
        assert cache.bytes_per_token() == mt.calc.kv_cache_bytes_per_token(cfg, 8, tp=2)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_calculator_counts_the_layer(name):
    """`mt.calc.exact_param_count` is the model's count; a forward's FLOPs, counted by torch,
    are a third of `mt.calc.model_flops` (weights, QKᵀ at d_h + d_r, ·V, the output layer)."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = CONFIGS[name]
    model = mt.GPT(cfg).double()
    assert mt.calc.exact_param_count(cfg) == model.num_parameters()
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(2, cfg.seq_len, dtype=torch.long))
    assert 3 * counter.get_total_flops() == mt.calc.model_flops(cfg, 2)


def test_deepseek_v3s_cache_is_the_formula_at_its_published_shape():
    """(512 + 64)·61·2 bytes (bf16) a token, against MHA's 2·128·128·61·2 (V3 §4.2)."""
    v3 = mt.calc.latent_vs_heads_cache(mt.calc.DEEPSEEK_V3_LATENT, bytes_per_value=2)
    assert v3["mla"] == 576 * 61 * 2 and v3["mha"] == 2 * 128 * 128 * 61 * 2
    with pytest.raises(ValueError, match="rope_dim must be a positive int"):
        mt.calc.mla_cache_bytes_per_token(512, 0, 61)


@pytest.mark.parametrize("fields, words", [
    (dict(rope_dim=5), "rope_dim=5 is odd"),
    (dict(kv_lora_rank=0), "kv_lora_rank > 0"),
    (dict(q_lora_rank=-1), "q_lora_rank"),
    (dict(n_kv_head=2), "n_kv_head=2 with latent attention"),
    (dict(positions="learned"), "positions='learned' with latent attention"),
])
def test_bad_sizes_are_refused_in_one_line(fields, words):
    with pytest.raises(ValueError, match=words) as error:
        mt.GPTConfig.mla(**SMALL, **fields)
    assert "\n" not in str(error.value)


def test_the_defaults_are_deepseek_v2s_ratios_and_the_arch_is_named():
    cfg = mt.GPTConfig.mla(**SMALL)  # head_dim 8: d_c = 4·8, d_h^R = 8/2
    assert (cfg.kv_lora_rank, cfg.rope_dim, cfg.q_lora_rank, cfg.arch) == (32, 4, 0, "mla")
    odd = mt.GPTConfig.mla(**{**SMALL, "d_model": 12})  # head_dim 3: only k^R, q^R turn
    assert odd.rope_dim == 2 and mt.GPT(odd)(torch.zeros(1, 4, dtype=torch.long))[0].shape[-1] == 64


def test_packed_documents_attend_within_themselves_and_restart_their_rotary_positions():
    """Two documents packed in one row (`minitp.data.packing`'s positions) are the two run
    apart: the causal mask block-diagonal, q^R and the shared k^R turned from 0 in each."""
    model = _model(CONFIGS["q-latent"])
    x = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    packed = model(x, positions=positions)[0]
    apart = torch.cat([model(x[:, :5])[0], model(x[:, 5:])[0]], dim=1)
    assert (packed - apart).abs().max() < 1e-13
