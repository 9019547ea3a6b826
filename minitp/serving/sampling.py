"""Drawing the next token from logits: greedy at temperature 0, else softmax(logits / T).

The seed rule, one for every layout: each sequence's draws come from one CPU
`torch.Generator` seeded with ``seed`` (the same seed on every rank), fed the logits in
float64 on the CPU. Every rank of a tensor-parallel group holds the same full logits (the
all-reduces and the vocabulary all-gather leave every rank the same bytes), so every rank
draws the same token with no message; a pipeline's last stage draws and sends it back.
"""

from __future__ import annotations

import math

import torch

# What torch.Generator.manual_seed takes: a 64-bit seed, signed or not
SEEDS = range(-2**63, 2**64)


def check_seed(seed) -> int:
    """`seed`, if a generator can take it (a whole number in [-2**63, 2**64)); else a
    ValueError. torch's own refusal is a RuntimeError deep in the first draw."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed not in SEEDS:
        raise ValueError(f"seed must be a whole number in [-2**63, 2**64), got {seed!r}")
    return seed


def check_temperature(temperature) -> float:
    """`temperature`, if finite and at least 0; else a ValueError. A NaN passes every
    comparison's `< 0` and makes every probability NaN; inf turns a masked logit's -inf
    into NaN: neither is a distribution."""
    if (not isinstance(temperature, int | float) or isinstance(temperature, bool)
            or not math.isfinite(temperature) or temperature < 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), "
                         f"got {temperature!r}")
    return temperature


def generator(seed: int) -> torch.Generator:
    """The CPU generator all of a run's draws come from (the seed rule above)."""
    return torch.Generator().manual_seed(check_seed(seed))


def draw(logits: torch.Tensor, temperature: float, gen: torch.Generator | None = None,
         allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The next token of each row of `logits` (B, V): argmax at temperature 0, else drawn
    from softmax(logits / temperature) with `gen`. allowed: (V,) bool, the tokens that may
    come (the others get probability 0). Returns (B,) int64 on the CPU."""
    check_temperature(temperature)
    logits = logits.detach().cpu()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    if temperature == 0:  # widening is exact and keeps the order: no need to
        return logits.argmax(-1)
    logits = logits.double()
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]
