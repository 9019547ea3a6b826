"""The GPT shapes the questions ask about, written once: Megatron-LM's vocabulary (51,200)
and sequence (2,048), the shapes of Narayanan et al. 2021, Table 1, and GPT-3 (Brown et al.
2020, Table 2.1)."""

from __future__ import annotations

from ...model import GPTConfig


def gpt(h: int, heads: int, layers: int) -> GPTConfig:
    return GPTConfig(vocab_size=51200, seq_len=2048, n_layer=layers, n_head=heads, d_model=h)
