"""Generation through a KV cache: `Decoder` feeds a growing sequence to a model (plain, or a
tensor-parallel rank's), `generate` runs prefill then decode and times them apart.

The window rule. The model has seq_len positions (learned positions exist for no more, and
every position's K and V depend on what it saw). While the sequence fits, prefill writes
the prompt's positions and each new token appends one. Once it is longer than seq_len,
every new token re-prefills the last seq_len tokens into an emptied cache: exactly what
the uncached sampler computes (it runs the last seq_len tokens every time), so cached and
uncached agree past the window too — and there the cache saves nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..model import GPT
from ..model.kv_cache import KVCache
from ..rules import check_token_ids
from .sampling import check_temperature, draw, generator


def window_start(cached: int, total: int, window: int) -> int:
    """Where the tokens a forward must feed begin, in a sequence of `total` tokens whose
    cache holds `cached` positions (0 after a reset: the last `window` tokens)."""
    return cached if cached else max(0, total - window)


def whole_logits(local: torch.Tensor) -> torch.Tensor:
    """One device's logits are already whole (the default `gather` of `Decoder`)."""
    return local


class Decoder:
    """The next-token logits of a batch of sequences that grow by a token at a time.

    ``next_logits(ids)``: ids (B, T), the whole sequences so far (each call's ids extend the
    previous call's); returns (B, V) the logits after their last token. The first call
    prefills; each later call feeds the cache the one new token (the window rule above).
    gather: the model's last-position logits (B, V') -> whole (B, V) (tensor parallelism's
    vocabulary all-gather). cached=False recomputes the last window every call: the
    reference."""

    def __init__(self, model: nn.Module, gather=whole_logits, cached: bool = True):
        self.model, self.gather, self.cached = model, gather, cached
        self.window = model.cfg.seq_len
        self.cache: KVCache | None = None

    def next_logits(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.cached:
            with torch.no_grad():
                return self.gather(self.model(ids[:, -self.window:])[0][:, -1])
        # inference mode, not just no_grad: no version counters, no autograd dispatch (a
        # decode step of a small model ~12% faster); the cache's tensors are made in it
        with torch.inference_mode():
            if self.cache is None or ids.shape[1] > self.window:
                self.cache = KVCache.for_model(self.model)  # prefill: an empty cache
            start = window_start(self.cache.length, ids.shape[1], self.window)
            with self.cache.bound(self.model):
                out = self.model(ids[:, start:])[0]  # what the cache lacks
            return self.gather(out[:, -1])


def check_prompt(prompt, vocab_size: int) -> None:
    """A prompt is (batch, tokens) int64 ids in the vocabulary, at least one of each; else
    one sentence saying what it was (raw, a str has no .shape and a 1-D tensor no dim 1)."""
    if not isinstance(prompt, torch.Tensor):
        raise TypeError(f"prompt must be a torch.Tensor of token ids, (batch, tokens), got "
                        f"{type(prompt).__name__}: text is minitp.data.encode(text)[None]")
    if prompt.dim() != 2:
        hint = ": one sequence is prompt[None]" if prompt.dim() == 1 else ""
        raise ValueError(f"prompt must be (batch, tokens), got a {prompt.dim()}-D tensor of "
                         f"shape {tuple(prompt.shape)}{hint}")
    if not prompt.numel():
        raise ValueError(f"prompt of shape {tuple(prompt.shape)} is empty: generation needs "
                         "at least one token of at least one sequence")
    check_token_ids(prompt, vocab_size, "prompt token id")


def check_request(model, prompt, n, temperature) -> None:
    """What `generate` (and `tp_generate`, `pp_generate`) are asked, checked before any
    forward: a minitp GPT (or a rank's shard of one), a prompt (`check_prompt`), n ≥ 0
    whole tokens, a temperature `draw` can use."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a minitp GPT (or a rank's shard of one), got "
                        f"{type(model).__name__}")
    check_prompt(prompt, model.cfg.vocab_size)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n, the tokens to generate, must be a whole number >= 0, got {n!r}")
    check_temperature(temperature)


@dataclass
class Generation:
    """What `generate` returns: ``tokens`` (B, T0 + n), each step's whole ``logits``
    (B, V) float64 (n of them), and the seconds of prefill and of the n − 1 decode steps."""

    tokens: torch.Tensor
    logits: list = field(default_factory=list)
    prompt_len: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens the decode steps made per second, the batch's rows counted."""
        steps = self.tokens.shape[1] - self.prompt_len - 1
        return self.tokens.shape[0] * steps / self.decode_s if steps and self.decode_s else 0.0


def generate(model: nn.Module, prompt: torch.Tensor, n: int, temperature: float = 0.0,
             seed: int = 0, cached: bool = True, gather=whole_logits,
             keep_logits: bool = True) -> Generation:
    """n tokens after `prompt` (B, T0) ids: greedy at temperature 0, else drawn by the seed
    rule (`minitp.serving.sampling`). The first token comes from the prefill, each other
    from one decode step (cached) or a recomputed window (cached=False). keep_logits=False
    keeps no logits (a timing: a float64 copy of (B, V) a step is not free)."""
    check_request(model, prompt, n, temperature)
    decoder, gen = Decoder(model, gather, cached), generator(seed)
    out = Generation(prompt, prompt_len=prompt.shape[1])
    ids = prompt
    for i in range(n):
        started = time.perf_counter()
        logits = decoder.next_logits(ids)
        token = draw(logits, temperature, gen).to(ids.device)
        elapsed = time.perf_counter() - started
        if i == 0:
            out.prefill_s = elapsed
        else:
            out.decode_s += elapsed
        if keep_logits:
            out.logits.append(logits.double().cpu())
        ids = torch.cat([ids, token[:, None]], dim=1)
    out.tokens = ids
    return out
