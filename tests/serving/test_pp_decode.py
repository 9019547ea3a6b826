"""Pipeline-parallel decoding (`minitp.serving.pp`) equals one device in float64 at pp 2:
three groups of sequences in flight (of 2, 1 and 2 rows, prompts of 4 and 6 tokens), drawn
at temperature 1 (group g from seed + g), 10 tokens: past the window of 12, where every
stage re-prefills its layers' cache. The trace holds each unit's region for the timeline."""

import torch

import minitp as mt
from minitp.serving import generate
from minitp.serving.pp import pipeline_bubble, pp_generate

CFG = mt.GPTConfig(vocab_size=64, seq_len=12, n_layer=2, n_head=4, d_model=32)
TOKENS = 10


def _ref():
    torch.manual_seed(0)
    return mt.GPT(CFG).double()


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, shape, generator=g) for shape in ((2, 4), (1, 6), (2, 4))]


def _rank():
    done = pp_generate(_ref(), mt.Mesh(pp=2), _prompts(), TOKENS, temperature=1.0, seed=5)
    return [(g.tokens, torch.stack(g.logits)) for g in done.groups]


def test_pipeline_decoding_equals_one_device():
    run = mt.launch(_rank, 2)
    assert run[0] == []  # the first stage draws nothing: the last stage does
    for g, prompt in enumerate(_prompts()):
        one = generate(_ref(), prompt, TOKENS, temperature=1.0, seed=5 + g, cached=False)
        tokens, logits = run[1][g]
        assert torch.equal(tokens, one.tokens), g
        assert float((logits - torch.stack(one.logits)).abs().max()) <= 1e-12
    labels = {(e.rank, e.label) for e in run.trace if e.op == "compute"}
    assert {(r, u) for r in (0, 1) for u in ("P0", "P2", "D1")} <= labels
    assert 0.0 <= pipeline_bubble(run.trace) < 1.0
