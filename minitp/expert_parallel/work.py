"""The routed experts' work, measured on this rank: how many rows its expert modules ran
and the FLOPs of the matmuls on them (forward: 2 per weight element per row), counted by
forward hooks while `expert_work` is open. Summed over the ranks, it shows what
`minitp.rules.expert_compute_copies` says: unfolded without sequence parallelism every
row is run tp times; folded, once (with etp each etp rank runs every row on its 1/etp of
the width: T times the rows, the same FLOPs)."""

from __future__ import annotations

import contextlib

import torch

from ..model.moe import moe_layers


@contextlib.contextmanager
def expert_work(model):
    """``with expert_work(model) as seen:`` — ``seen["rows"]``, ``seen["flops"]``: this
    rank's expert rows and forward FLOPs in the training forwards run inside (gradient
    on; a forward-only evaluation is not counted)."""
    seen = {"rows": 0, "flops": 0}
    handles = []
    for layer in moe_layers(model):
        experts = layer.experts
        per_row = 2 * (experts.fc_weight[0].numel() + experts.proj_weight[0].numel())

        def hook(module, inputs, output, per_row=per_row):
            if torch.is_grad_enabled():
                seen["rows"] += inputs[0].shape[0]
                seen["flops"] += inputs[0].shape[0] * per_row
        handles.append(experts.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
