"""Decode throughput measured: tokens per second against batch size, at each tp, on this
machine (`decode_throughput`). A measurement, not a model: `mt.calc`'s decode model is what
to set it beside.

Each tp is one launch of tp ranks; each rank builds the same seeded model, takes its heads
(`tp_model`), and for each batch size runs a prefill of ``prompt_len`` tokens and
``tokens`` − 1 greedy decode steps, timed (`generate`'s ``decode_s``), after one untimed
warm-up generation. Tokens per second count every row of the batch.
"""

from __future__ import annotations

import torch

from ..model import GPT, GPTConfig
from ..runtime import trace
from ..runtime.mesh import Mesh
from .decode import generate
from .tp import tp_model, vocab_gather


def _measure(cfg: GPTConfig, batches, tokens: int, prompt_len: int, seed: int) -> dict:
    from ..runtime._device import device

    torch.manual_seed(seed)
    model = tp_model(GPT(cfg).to(device()), Mesh(tp=torch.distributed.get_world_size()))
    gather, ids = vocab_gather(model), torch.Generator().manual_seed(seed)
    out = {}
    with trace.paused():
        for i, batch in enumerate(batches):
            prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=ids)
            prompt = prompt.to(device())
            if i == 0:
                generate(model, prompt, 2, gather=gather)  # warm-up: first calls are slow
            out[batch] = generate(model, prompt, tokens, gather=gather,
                                  keep_logits=False).decode_tokens_per_s
    return out


def decode_throughput(cfg: GPTConfig, batches=(1, 4, 16), tps=(1, 2, 4), tokens: int = 16,
                      prompt_len: int = 8, seed: int = 0) -> dict[int, dict[int, float]]:
    """Measured decode tokens per second: {tp: {batch: tokens/s}}, greedy, `cfg` built from
    `seed`, float32. Each tp must split `cfg`'s heads (`mt.check_parallel_config`'s rule)."""
    from ..rules import check_parallel_config
    from ..runtime.launch import launch

    if prompt_len + tokens - 1 > cfg.seq_len:
        raise ValueError(f"prompt_len={prompt_len} + tokens={tokens} − 1 passes the window "
                         f"seq_len={cfg.seq_len}: past it every token re-prefills")
    for tp in tps:
        check_parallel_config(cfg, tp=tp, world_size=tp)
    return {tp: launch(_measure, tp, cfg, tuple(batches), tokens, prompt_len, seed)[0]
            for tp in tps}
