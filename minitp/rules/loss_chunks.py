"""How many tokens' logits the loss widens to float32 at once: the chunk rule.

The loss's softmax needs float32 (bf16's 8-bit mantissa rounds away a vocabulary's small
probabilities), but not all of it at once. The rule: a chunk holds at most as many logit
values as the hidden states entering the output layer (tokens × d_model), so the loss's
float32 working set is never larger than an activation the model already keeps. That is
ceil(width / d_model) chunks of ceil(tokens / chunks) rows — Liger-Kernel's fused linear
cross-entropy sizes its chunks the same way (linkedin/Liger-Kernel,
src/liger_kernel/ops/fused_linear_cross_entropy.py: ``inc_factor = cdiv(V, H)``; it then
rounds the rows up to a power of two, which a Triton kernel wants and this does not).
A vocabulary no wider than the model is one chunk: nothing to save, nothing spent.
"""

from __future__ import annotations

from .sizes import ceil_div, check_positive_int


def loss_chunk_rows(tokens: int, width: int, d_model: int) -> int:
    """Rows (tokens) per chunk for `tokens` rows of `width` logits (a rank's vocabulary
    columns) under a model `d_model` wide: ceil(tokens / ceil(width / d_model)), at least 1."""
    check_positive_int("width", width)
    check_positive_int("d_model", d_model)
    if tokens <= 0:
        return 1
    return ceil_div(tokens, ceil_div(width, d_model))
