"""Expert tensor parallelism (etp, folded layouts only): each expert's MLP split over the
etp ranks as Megatron-LM splits a dense MLP — fc by columns (its hidden width), proj by
rows — so an etp rank computes, for every row it is given, a partial output; the etp
ranks' partials sum to the expert's output (`minitp.expert_parallel.dispatch` gathers the
rows over etp and sums the partials back).

proj's bias is not split: it must be added once to that sum. Each etp rank adds
bias/etp (`_OneShare`: forward × 1/etp, backward the identity), so the sum holds it once,
and every etp rank's copy gets the whole gradient (every etp rank sees the gradient of
every gathered row), so the copies stay equal with no extra communication.
"""

from __future__ import annotations

import torch

from ..model.expert_mlps import expert_mlps
from ..model.moe import Experts
from ..runtime.mesh import Axis

# the dimension of each (E, …) stack that holds an expert's hidden width
HIDDEN_DIM = {"fc_weight": 2, "fc_bias": 1, "proj_weight": 1, "proj_bias": None}


def expert_slice(name: str, value: torch.Tensor, etp: Axis | None):
    """(this etp rank's slice of an expert stack `name`, the dimension it was cut along, or
    None where it is whole over etp)."""
    dim = HIDDEN_DIM[name]
    if etp is None or etp.size == 1 or dim is None:
        return value, None
    width = value.shape[dim] // etp.size
    return value.narrow(dim, etp.rank * width, width), dim


class _OneShare(torch.autograd.Function):
    """Forward: x/parts (the parts' sum holds x once) · backward: the whole gradient."""

    @staticmethod
    def forward(ctx, x, parts: int):
        return x / parts

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ExpertSlice(Experts):
    """A run of experts, each cut to this etp rank's share of its hidden width: forward
    gives each row's partial output (its share of proj's bias included)."""

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        bias = None if self.proj_bias is None else _OneShare.apply(self.proj_bias, self.parts)
        return expert_mlps(x, counts, self.fc_weight, self.fc_bias, self.proj_weight, bias)
