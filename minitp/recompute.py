"""Activation recomputation: keep fewer activations, recompute them in backward.

* ``"full"``: each transformer layer keeps only its input; the whole layer runs
  again during backward (Korthikanti et al.: 2sbh bytes per layer, ~+39% time
  per layer on their 22B model).
* ``"selective"``: only the attention core — scores, softmax, dropout, ·V — is
  recomputed. Those are the tensors that grow with s² (the 5as/h term of the
  activation formula) yet cost few FLOPs to redo (~+7% time).

Both use ``torch.utils.checkpoint`` without reentrancy. It restores the default
random generator before recomputing, so dropout draws the same masks again
(`minitp.tensor_parallel.dropout.ShardedDropout` derives its seeds from that generator too).
"""

from __future__ import annotations

import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from .rules import check_recompute
from .runtime import trace
from .sharding.plan import replace_modules

# Which modules of the (tensor-parallel) GPT each mode wraps in `Recomputed`.
RECOMPUTE_PLAN = {"full": "blocks.*", "selective": "blocks.*.attn.core"}


class Recomputed(nn.Module):
    """Runs `module` under activation checkpointing: only its inputs are kept."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **keywords):  # keywords: a packed batch's positions
        if not self.training:
            return self.module(*inputs, **keywords)
        # The recomputation runs inside backward, long after this forward's trace
        # label ended: carry the label along so its collectives stay attributed.
        return checkpoint(self._run, trace.recorder().label, *inputs, use_reentrant=False,
                          **keywords)

    def _run(self, label, *inputs, **keywords):
        with trace.relabel(label):
            return self.module(*inputs, **keywords)


def apply_recompute(model: nn.Module, mode) -> None:
    """Wrap the modules that `mode` recomputes (None: nothing) in `Recomputed`."""
    check_recompute(mode)
    if mode and not replace_modules(model, RECOMPUTE_PLAN[mode], Recomputed):
        raise RuntimeError(f"recompute plan {RECOMPUTE_PLAN[mode]!r} matched no module")
