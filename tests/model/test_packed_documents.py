"""A packed row is its documents run one by one: the plain GPT in float64, with learned
positions and with RoPE (GQA), the attention written out and sdpa's — the loss (the mean
over every counted target of the row) and every gradient. And a vision-language model
refuses packing in one line, as does a position outside the window (a negative one would
index learned positions from the end)."""

from __future__ import annotations

import pytest
import torch

import minitp as mt
from minitp.data.packing import pack

TOLERANCE = 1e-12
GPT2 = dict(vocab_size=16, seq_len=24, n_layer=2, n_head=4, d_model=16)
LLAMA = dict(GPT2, norm="rmsnorm", positions="rope", mlp="swiglu", bias=False, n_kv_head=2)
CONFIGS = {"gpt2-math": GPT2, "gpt2-sdpa": dict(GPT2, attention="sdpa"),
           "llama-math": LLAMA, "llama-sdpa": dict(LLAMA, attention="sdpa")}


def _documents(lengths, vocab):
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]


def _one_by_one(model, documents):
    """Each document alone (unpacked, positions 0..n−1): the sum of its targets' losses and
    their count, summed over the documents; the gradients of sum/count accumulate."""
    total = sum(len(d) - 1 for d in documents)
    for doc in documents:
        x, y = doc[None, :-1], doc[None, 1:]
        _, loss = model(x, y)
        (loss * (len(doc) - 1) / total).backward()
        yield float(loss.detach()) * (len(doc) - 1) / total


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_packed_row_is_its_documents_one_by_one(name):
    cfg = mt.GPTConfig(**CONFIGS[name])
    torch.manual_seed(0)
    model = mt.GPT(cfg).double()
    documents = _documents([7, 3, 9, 6], cfg.vocab_size)  # 25 tokens: one row of 24 + 1
    x, y, positions = pack(documents, cfg.seq_len)
    assert x.shape == (1, cfg.seq_len)
    _, loss = model(x, y, positions=positions)
    loss.backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    alone = sum(_one_by_one(model, documents))
    assert abs(float(loss.detach()) - alone) < TOLERANCE
    for n, p in model.named_parameters():
        assert (packed[n] - p.grad).abs().max() < TOLERANCE, n


def test_positions_none_is_the_unpacked_model():
    """One document filling the row, its positions 0..T−1: the packed path is the plain one."""
    cfg = mt.GPTConfig(**LLAMA)
    torch.manual_seed(0)
    model = mt.GPT(cfg).double()
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    positions = torch.arange(cfg.seq_len).expand(2, -1)
    plain, packed = model(x)[0], model(x, positions=positions)[0]
    assert (plain - packed).abs().max() < TOLERANCE


def test_a_vision_language_model_refuses_packing():
    cfg = mt.GPTConfig(**dict(GPT2, vocab_size=256, vision_patches=4, vision_width=8,
                              vision_heads=2))
    model = mt.GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len))
    with pytest.raises(ValueError, match="no document to mask by, so packing is refused"):
        model(x, positions=torch.zeros_like(x))


@pytest.mark.parametrize("name", ["gpt2-math", "llama-math"])
@pytest.mark.parametrize("bad", [-1, 24])
def test_a_position_outside_the_window_is_refused(name, bad):
    model = mt.GPT(mt.GPTConfig(**CONFIGS[name]))
    x = torch.zeros(1, 6, dtype=torch.long)
    positions = torch.tensor([[0, 1, 2, 0, bad, 2]])
    with pytest.raises(ValueError, match=rf"^packed position {bad} is outside the model's "
                                         r"window: .* must be in \[0, seq_len=24\)$"):
        model(x, positions=positions)
