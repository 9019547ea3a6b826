"""Tensor-parallel decoding (`minitp.serving.tp`) equals one device in float64, on real
ranks: GPT-2 at tp 2 (heads split) and the Llama-style model at tp 4 with 2 K/V heads
(replicated by the training rule), drawn at temperature 1 from one seed — every rank draws
the same tokens as the one uncached device. The trace shows 2 all-reduces per block per
token, plus the embedding's one and the logits' all-gather. Ranks given different prompts
are refused on every rank, naming which holds which (tp_generate's over tp, pp_generate's
over pp: one launch of 2 ranks for both)."""

import pytest
import torch

import minitp as mt
from minitp.serving import generate, per_token_collectives, pp_generate, tp_generate

SMALL = dict(vocab_size=64, seq_len=12, n_layer=2, n_head=4, d_model=32)
TOKENS = 6


def _ref(cfg):
    torch.manual_seed(0)
    return mt.GPT(cfg).double()


def _prompt():
    return torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1))


def _rank(cfg, tp):
    g = tp_generate(_ref(cfg), mt.Mesh(tp=tp), _prompt(), TOKENS, temperature=1.0, seed=3)
    return g.tokens, torch.stack(g.logits), g.prefill_s


@pytest.mark.parametrize("cfg, tp", [(mt.GPTConfig(**SMALL), 2),
                                     (mt.GPTConfig.llama(**SMALL, n_kv_head=2), 4)],
                         ids=["gpt2-tp2", "llama-gqa-tp4"])
def test_every_rank_equals_one_device(cfg, tp):
    run = mt.launch(_rank, tp, cfg, tp)
    one = generate(_ref(cfg), _prompt(), TOKENS, temperature=1.0, seed=3, cached=False)
    for r in range(tp):
        tokens, logits, _ = run[r]
        assert torch.equal(tokens, one.tokens), r
        assert float((logits - torch.stack(one.logits)).abs().max()) <= 1e-12
    per_token = per_token_collectives(run.trace, tokens=TOKENS)["count"]
    assert per_token == {"all_reduce": 2 * cfg.n_layer + 1, "all_gather": 1}


def _mismatched_prompts(cfg):
    """Rank 1's prompt differs from rank 0's, over tp (tp_generate) and over pp
    (pp_generate, a list of groups): each call's refusal, as every rank saw it."""
    out = {}
    for kind, mesh in (("tp", mt.Mesh(tp=2)), ("pp", mt.Mesh(pp=2))):
        rank = mesh.tp.rank if kind == "tp" else mesh.pp.rank
        prompt = (_prompt() + rank) % 64  # rank 1's ids differ from rank 0's
        try:
            if kind == "tp":
                tp_generate(_ref(cfg), mesh, prompt, 2)
            else:
                pp_generate(_ref(cfg), mesh, [prompt[:1], prompt[1:]], 2)
        except ValueError as error:
            out[kind] = str(error)
    return out


@pytest.fixture(scope="module")
def mismatched():
    return mt.launch(_mismatched_prompts, 2, mt.GPTConfig(**SMALL))


@pytest.mark.parametrize("kind", ["tp", "pp"])
def test_ranks_given_different_prompts_are_refused_on_every_rank(mismatched, kind):
    assert mismatched[0].get(kind) == mismatched[1].get(kind) == (
        f"the {kind} ranks were given different prompts (ranks [0]; ranks [1] each hold "
        "their own): every rank of the group must pass the same prompt"), list(mismatched)
