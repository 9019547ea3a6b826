"""ZeRO-3's all-gather in 8 bits (`minitp.fp8.gather`) sends about half of bf16's bytes,
measured: the kernel's count of each rank's written bytes (``sent_bytes``) while a block's
parameters are gathered — alone, nothing else in flight (inside a step the gathers overlap
other collectives, and the counter cannot say whose bytes are whose) — against the same
gather under bf16 mixed precision."""

import pytest
import torch

import minitp as mt
from minitp.runtime import io_counters

pytestmark = pytest.mark.skipif(not io_counters.available(),
                                reason="no /proc/self/io: sent_bytes is not measured here")
CFG = dict(vocab_size=16, seq_len=8, n_layer=1, n_head=4, d_model=64)


def _gather_bytes():
    """The bytes this rank sent gathering block 0's parameters: bf16, then 8-bit FP8."""
    mesh, cfg = mt.Mesh(dp=2), mt.GPTConfig(**CFG)
    sent = {}
    for name, options in (("bf16", dict(param_dtype=torch.bfloat16)),
                          ("fp8", dict(fp8="tensorwise", fp8_all_gather=True))):
        torch.manual_seed(0)
        model = mt.parallelize(mt.GPT(cfg), mesh, zero_stage=3, **options)
        (unit,) = [u for u in model.zero_units if u.name == "blocks.0"]
        before = len(mt.trace.events())
        unit.take_gathered()
        sent[name] = sum(e.sent_bytes for e in mt.trace.events()[before:])
    return sent


def test_the_8_bit_gather_sends_about_half_of_bf16s_bytes():
    for rank, sent in enumerate(mt.launch(_gather_bytes, 2)):
        ratio = sent["fp8"] / sent["bf16"]
        assert 0.5 < ratio < 0.6, f"rank {rank}: {sent} ({ratio:.3f})"
