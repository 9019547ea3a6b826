"""`minitp.serving.generate`'s bad input, refused in one sentence before any forward (no
processes): a prompt that is not (batch, tokens) ids — 1-D, empty, 3-D, a list, a str —
a module that is not a GPT, a negative n, a temperature that is no distribution's, a seed
no generator takes."""

import pytest
import torch
import torch.nn as nn

import minitp as mt
from minitp.serving import draw, generate, generator

CFG = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=1, n_head=2, d_model=8)


@pytest.fixture(scope="module")
def model():
    return mt.GPT(CFG)


@pytest.mark.parametrize("prompt, error, message", [
    (torch.tensor([1, 2, 3]), ValueError, r"got a 1-D tensor of shape \(3,\): one sequence "
                                          r"is prompt\[None\]"),
    (torch.zeros(1, 0, dtype=torch.long), ValueError, r"shape \(1, 0\) is empty"),
    (torch.zeros(0, 3, dtype=torch.long), ValueError, r"shape \(0, 3\) is empty"),
    (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, r"got a 3-D tensor of shape \(1, 2, 3\)"),
    ([[1, 2, 3]], TypeError, r"must be a torch.Tensor of token ids, \(batch, tokens\), got list"),
    ("def ", TypeError, r"got str: text is minitp.data.encode\(text\)\[None\]"),
    (torch.ones(1, 3), TypeError, r"prompt token ids must be int64"),
], ids=["1-D", "no-tokens", "no-rows", "3-D", "list", "str", "float"])
def test_a_prompt_that_is_not_batch_by_tokens_ids_is_refused(model, prompt, error, message):
    with pytest.raises(error, match=message) as raised:
        generate(model, prompt, 2)
    assert "\n" not in str(raised.value)


def test_a_module_that_is_not_a_gpt_is_refused():
    with pytest.raises(TypeError, match="^model must be a minitp GPT .*, got Linear$"):
        generate(nn.Linear(4, 4), torch.zeros(1, 2, dtype=torch.long), 2)


def test_a_negative_n_is_refused(model):
    with pytest.raises(ValueError, match="must be a whole number >= 0, got -3$"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), -3)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0])
def test_a_temperature_that_is_no_distributions_is_refused(temperature):
    with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0"):
        draw(torch.zeros(1, 4), temperature, generator(0))


def test_a_seed_no_generator_takes_is_refused():
    with pytest.raises(ValueError, match=r"seed must be a whole number in \[-2\*\*63, 2\*\*64\)"):
        generator(2**70)
