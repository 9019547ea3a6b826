"""The generator's numbers beside the trainer's, on the same tokens: what RL post-training
needs of a refit (`minitp.serving.refit`), and where bf16 loses it.

* `logprob_parity`: the generator's log-probabilities of a generation's tokens (decoding
  them through its KV cache at the serving layout) beside the trainer's forward over the
  same tokens (the whole sequence at the training layout);
* `routing_flips`: in a mixture of experts, the (layer, token) routing decisions whose
  top-k experts differ between the two.

Equal in float64; in bf16 a row-parallel layer's sum over tp ranks rounds each partial
sum, so another tp is another rounding (measured in `tests/serving/test_refit.py`).
"""

from __future__ import annotations

import contextlib

import torch

from ..model.routing import Router
from ..runtime import _device
from .decode import Decoder
from .tp import vocab_gather


def token_logprobs(model, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T − 1) float64: log p(tokens[:, t + 1] | tokens[:, :t + 1]) by one forward of a
    one-stage parallel `model` over the whole sequence (its vocabulary gathered over tp)."""
    if model.mesh.pp_size != 1 or model.mesh.cp_size != 1:
        raise ValueError("token_logprobs runs one stage over whole sequences: a pp > 1 "
                         "trainer's forward runs in its schedule, a cp > 1 one takes chunks "
                         "of each sequence (score with a pp-1, cp-1 layout of the weights)")
    with torch.no_grad():
        local = model(tokens[:, :-1].to(_device.device()))[0]
    logits = vocab_gather(model)(local).double().cpu()
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None].cpu())[..., 0]


def generator_logprobs(served, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """(B, T − prompt_len) float64: the generator's log-probabilities of `tokens` after
    their first `prompt_len`, the way it decodes: the prompt prefilled into its KV cache,
    then one token fed a step (each the given one, not a new draw)."""
    decoder = Decoder(served, vocab_gather(served))
    tokens = tokens.to(_device.device())
    steps = []
    for t in range(prompt_len, tokens.shape[1]):
        logits = decoder.next_logits(tokens[:, :t]).double().cpu()
        steps.append(torch.log_softmax(logits, -1).gather(-1, tokens[:, t, None].cpu())[:, 0])
    return torch.stack(steps, dim=1)


def logprob_parity(trainer, served, tokens: torch.Tensor, prompt_len: int) -> dict:
    """The generator's (`served`'s, through its cache) log-probabilities of `tokens` after
    the prompt beside the `trainer`'s forward over the same tokens. `tokens`: what a
    generation sampled, its prompt first. Returns {"generator", "trainer": (B, n) float64,
    "max_diff"}."""
    theirs = token_logprobs(trainer, tokens)[:, prompt_len - 1:]  # first: it may refuse
    mine = generator_logprobs(served, tokens, prompt_len)
    return {"generator": mine, "trainer": theirs,
            "max_diff": float((mine - theirs).abs().max())}


@contextlib.contextmanager
def _routes(model):
    """Inside: every `Router` of `model` appends its chosen experts (N, k) to a list, one
    list a layer (in the model's order), yielded."""
    routers = [m for m in model.modules() if isinstance(m, Router)]
    seen: list[list] = [[] for _ in routers]
    hooks = [r.register_forward_hook(lambda _m, _i, out, mine=mine: mine.append(out[0]))
             for r, mine in zip(routers, seen, strict=True)]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def routing_flips(trainer, served, tokens: torch.Tensor, prompt_len: int) -> tuple[int, int]:
    """(flips, decisions): the (layer, sequence, position) routing decisions over
    tokens[:, :-1] whose set of top-k experts differs between the trainer's forward and the
    generator decoding the same tokens (`generator_logprobs`'s path), and how many there
    were. Both models one stage, sequence parallelism off (each router sees every token)."""
    B, T = tokens.shape
    with _routes(trainer) as theirs:
        token_logprobs(trainer, tokens)
    with _routes(served) as mine:
        generator_logprobs(served, tokens, prompt_len)
    flips = decisions = 0
    for a, b in zip(theirs, mine, strict=True):
        whole = a[0].view(B, T - 1, -1)  # one forward: every position at once
        steps = torch.cat([x.view(B, -1, whole.shape[-1]) for x in b], dim=1)  # prefill, steps
        same = (whole.sort(-1).values.cpu() == steps.sort(-1).values.cpu()).all(-1)
        flips += int((~same).sum())
        decisions += same.numel()
    return flips, decisions
