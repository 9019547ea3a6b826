"""FP8 on a parallel model: each tensor-parallel linear layer given its scales, whose amax
is reduced over the axes the rule names (`minitp.rules.fp8_groups`). Called by
`mt.parallelize(..., fp8=…)` after tensor parallelism swapped in the sharded layers and
before the pipeline cuts the blocks into stages.
"""

from __future__ import annotations

import warnings

import torch.nn as nn

from ..rules import layer_label
from ..rules.fp8_groups import amax_axes, check_fp8_blocks, check_fp8_model, roles
from ..runtime.mesh import Mesh
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from .casts import LayerScales
from .convert import block_linears
from .scaling import DEFAULT_HISTORY

LOCAL_SCALES_WARNING = ("fp8_local_scales: every rank scales its piece of a split tensor by "
                        "its own amax — not the one-process run (the trap, on purpose)")


def layer_kind(module: nn.Module) -> str:
    """"column" or "row": how a block's linear layer is split over tp."""
    if isinstance(module, ColumnParallelLinear):
        return "column"
    if isinstance(module, RowParallelLinear):
        return "row"
    raise ValueError(f"fp8 covers tensor-parallel linear layers, not {type(module).__name__}")


def amax_groups(kind: str, mesh: Mesh, scaling: str, sequence_parallel: bool,
                local_scales: bool = False) -> dict:
    """role -> the mesh's axes (of more than one rank) its amax is MAX-reduced over."""
    return {role: tuple(axis for name in amax_axes(kind, role, scaling, sequence_parallel,
                                                   local_scales)
                        if (axis := getattr(mesh, name)).size > 1)
            for role in roles(scaling)}


def apply_fp8(model: nn.Module, mesh: Mesh, scaling: str | None, sequence_parallel: bool,
              local_scales: bool = False, history_len: int = DEFAULT_HISTORY) -> None:
    """Give every block's (tensor-parallel) linear layer of `model` its FP8 scales."""
    if scaling is None:
        if local_scales:
            raise ValueError("fp8_local_scales needs fp8 (a scaling to localise)")
        return
    check_fp8_model(model.cfg, mesh.tp.size)
    check_fp8_blocks(model.cfg, scaling, mesh.tp.size, mesh.cp.size)
    if local_scales:
        warnings.warn(LOCAL_SCALES_WARNING, stacklevel=3)
    for index, name, module in block_linears(model):
        groups = amax_groups(layer_kind(module), mesh, scaling, sequence_parallel, local_scales)
        module.fp8 = LayerScales(scaling, groups, history_len, f"{layer_label(index)}.{name}")
