"""Context parallelism for multi-head latent attention (`minitp.model.mla`): the latent
gathered, not the heads' K and V.

Every head's K and V are up-projected from one latent c_KV (kv_lora_rank values a token) and
one rotary key k^R (rope_dim values) shared by all heads. So the natural all-gather variant
(`cp_comm="allgather"`, `minitp.context_parallel.allgather` for the other attentions) gathers
those two over cp, and each rank then makes the whole sequence's K and V for its own heads:
(d_c + d_h^R) values a token on the wire, where gathering K and V would move
n_h/t·(2d_h + d_h^R) (DeepSeek-V3 at tp 8: 576 against 16·320 = 5,120). k^R is turned by
its global positions before it is gathered (`ContextParallelRotary`), as a rank holding
the whole sequence would have turned it. Backward: every rank's queries produced gradients
for every position's latent and k^R, so they are partial; the all-gather's conjugate sums
them over cp and hands each rank its own chunks' (`gather_keys`). The rank keeps the
gathered latent and the K and V made from it for backward: s positions, not s/cp.

The other variants are refused (`minitp.rules.mla.check_mla_parallel`): the ring and
Ulysses pass or split the heads' K and V, which latent attention makes only from the
latent — a ring of latents is possible (each step would up-project a received block) but
not built here; "allgather-regather" is not built for it either.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..model.attention_core import keep_mask
from ..runtime import trace
from ..runtime.mesh import Axis
from .allgather import gather_keys, masked_attention
from .split import global_positions


class GatheredLatent(nn.Module):
    """Replaces `MadeKeys`: (c_KV, k^R) of this rank's chunks -> the whole sequence's, in
    global order, on every cp rank (backward: their gradients summed, each rank its own)."""

    def __init__(self, cp: Axis):
        super().__init__()
        self.cp = cp

    def forward(self, latent, k_pe):  # (B, 1, 2c, dc), (B, 1, 2c, r)
        with trace.label("allgather latent"):
            return gather_keys(latent, self.cp), gather_keys(k_pe, self.cp)

    def extra_repr(self) -> str:
        return f"latent and rotary key all-gathered over {self.cp.name} ranks {list(self.cp.ranks)}"


class GatheredKeysAttention(nn.Module):
    """Replaces `AttentionCore`: this rank's query chunks against keys and values already
    made for the whole sequence, causal at global positions ("math" or "sdpa")."""

    def __init__(self, cp: Axis, attention: str = "math"):
        super().__init__()
        self.cp, self.attention = cp, attention

    def forward(self, q, k, v, positions=None):  # q (B, nh, 2c, ·), k and v (B, ·, s, ·)
        mine = global_positions(q.shape[-2], self.cp, q.device)
        if positions is not None:
            positions = positions.to(q.device)
        keep = keep_mask(positions, mine, torch.arange(k.shape[-2], device=q.device))
        return masked_attention(q, k, v, keep, self.attention)


def latent_plan(cp: Axis) -> list:
    """What `apply_context_parallel` puts in a latent-attention GPT (its rotary and loss
    pieces are every GPT's)."""
    return [("blocks.*.attn.keys", lambda m, cp, model: GatheredLatent(cp)),
            ("blocks.*.attn.core", lambda m, cp, model: GatheredKeysAttention(cp, m.attention))]
