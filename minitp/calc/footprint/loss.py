"""The loss's bytes on the rank that computes it, unchunked and in chunks: a MODEL.

`activation_bytes` leaves the output layer and the loss out, as Korthikanti et al. (2022,
§4.3) do. At a large vocabulary they are not small, and how the loss is computed decides
them. For N tokens and w = ⌈V/t⌉ vocabulary columns on the rank, logits of L bytes a value,
counted from the moment the output layer makes them:

* **unchunked**, PyTorch's ``F.cross_entropy`` on the logits widened to float32 (as
  Megatron-LM's loss casts them): it keeps the float32 log-softmax, 4Nw, for backward, and
  lets the logits go; in backward the loss's gradient (4Nw) and the log-softmax's (4Nw) are
  made while the kept one is alive: a peak of 12Nw;
* **chunked** (`minitp.model.cross_entropy`, r = `loss_chunk_rows` tokens a chunk): it keeps
  the logits themselves (L·Nw) and one float32 number per token (4N); its backward makes the
  gradient in the logits' own dtype (L·Nw) and, a chunk at a time, the chunk widened (4rw,
  when L < 4) and its softmax (4rw): a peak of 2·L·Nw + 8rw (8Nw + 4rw in float32).

Small per-token vectors (targets, masks, the row factors) are left out. Lesson 04 measures
both beside this model (`minitp.memory.peak_allocated`), and lesson 21 a whole bf16 step.
"""

from __future__ import annotations

from ...rules import ceil_div, loss_chunk_rows


def loss_bytes(tokens: int, vocab: int, d_model: int, tp: int = 1, logits_bytes: int = 2,
               chunked: bool = True) -> dict:
    """``{"kept": bytes kept from forward to backward, "peak": the most bytes the loss holds
    at once}`` for `tokens` tokens of a `vocab`-wide vocabulary split over `tp` ranks,
    logits of `logits_bytes` bytes a value (MODELLED)."""
    width = ceil_div(vocab, tp)
    if not chunked:
        return {"kept": 4 * tokens * width, "peak": 12 * tokens * width}
    rows = loss_chunk_rows(tokens, width, d_model)
    chunk = (8 if logits_bytes < 4 else 4) * rows * width
    logits = logits_bytes * tokens * width
    return {"kept": logits + 4 * tokens, "peak": 2 * logits + chunk}
