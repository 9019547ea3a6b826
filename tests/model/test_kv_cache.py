"""The KV cache (`minitp.model.kv_cache`): cached decoding equals uncached in float64, for
GPT-2 and for the Llama-style model with grouped-query attention, both attention cores; its
bytes per token are 2·layers·kv_heads·head_dim·bytes, read from its tensors; and past the
window (seq_len positions) each token re-prefills the last window, as the uncached does."""

import pytest
import torch

import minitp as mt
from minitp.model.kv_cache import KVCache
from minitp.serving import Decoder, generate

SMALL = dict(vocab_size=64, seq_len=12, n_layer=2, n_head=4, d_model=32)
CONFIGS = {
    "gpt2": mt.GPTConfig(**SMALL),
    "llama-gqa": mt.GPTConfig.llama(**SMALL, n_kv_head=2),
    "llama-gqa-sdpa": mt.GPTConfig.llama(**SMALL, n_kv_head=2, attention="sdpa"),
}


def _model(cfg):
    torch.manual_seed(0)
    return mt.GPT(cfg).double().eval()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cached_greedy_decoding_equals_uncached(name):
    """Prompt 5 + 16 tokens: through the window's end (12) and 9 tokens past it."""
    model = _model(CONFIGS[name])
    prompt = torch.randint(0, 64, (3, 5), generator=torch.Generator().manual_seed(1))
    cached, plain = generate(model, prompt, 16), generate(model, prompt, 16, cached=False)
    assert torch.equal(cached.tokens, plain.tokens)
    diff = max(float((a - b).abs().max()) for a, b in zip(cached.logits, plain.logits, strict=True))
    assert diff <= 1e-12, diff


def test_the_bytes_per_token_are_the_formula():
    """2 · layers · kv_heads · head_dim · bytes, the cache's tensors measured (GQA: 2 K/V
    heads of 4, float32)."""
    cfg = CONFIGS["llama-gqa"]
    model = mt.GPT(cfg).eval()
    cache = KVCache.for_model(model)
    with torch.no_grad(), cache.bound(model):
        model(torch.zeros(4, 3, dtype=torch.long))
    assert cache.length == 3
    assert cache.bytes_per_token() == 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * 4
    assert cache.nbytes == cache.bytes_per_token() * 4 * cfg.seq_len  # batch 4, seq_len


def test_past_the_window_each_token_re_prefills_the_last_window():
    """At seq_len positions the cache is full: the next call starts a new cache holding the
    last seq_len tokens; a cache never takes more than its seq_len positions."""
    model = _model(CONFIGS["gpt2"])
    decoder = Decoder(model)
    ids = torch.randint(0, 64, (1, 12))
    decoder.next_logits(ids)
    first = decoder.cache
    assert first.length == 12
    decoder.next_logits(torch.cat([ids, ids[:, :1]], dim=1))
    assert decoder.cache is not first and decoder.cache.length == 12
    with pytest.raises(ValueError, match="longer than seq_len=12"), torch.no_grad():
        with decoder.cache.bound(model):
            model(ids[:, :1])
