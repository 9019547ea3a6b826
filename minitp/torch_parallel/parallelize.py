"""minitp's GPT parallelized by PyTorch's own parallelism, on minitp's `Mesh`."""

from __future__ import annotations

import copy

import torch.nn as nn

from ..model import GPT
from ..parallelize import check_plain_gpt
from ..rules.torch_parallel import check_torch_model
from ..runtime.mesh import Mesh
from .device_mesh import device_mesh
from .fsdp import apply_fully_shard
from .step import ParallelCrossEntropy
from .tp_plan import apply_tensor_parallel


def parallelize(ref: GPT, mesh: Mesh, sequence_parallel: bool = False, hsdp: int | None = None,
                reshard_after_forward: bool = True) -> nn.Module:
    """A copy of `ref` split by torch: tensor parallelism over ``mesh.tp`` by
    ``parallelize_module`` (`minitp.torch_parallel.tp_plan`), the data-parallel axis by
    FSDP2's ``fully_shard`` — or with ``hsdp=R``, HSDP: R replicas of dp/R shards
    (`minitp.torch_parallel.fsdp`). Train it with `minitp.torch_parallel.train_step` and
    ``torch.optim.AdamW(model.parameters(), …)``; its parameters are DTensors
    (``.full_tensor()`` gives the whole). ``model.device_mesh`` is the DeviceMesh,
    ``model.mesh`` the `Mesh` it came from. `ref` is left as it was."""
    check_plain_gpt(ref, "torch_parallel.parallelize")
    cfg = ref.cfg
    check_torch_model(cfg.n_experts, cfg.vision_patches, cfg.n_kv_head, cfg.mlp)
    dm = device_mesh(mesh, hsdp)
    model = copy.deepcopy(ref)
    model.loss = ParallelCrossEntropy()
    if mesh.tp.size > 1:
        apply_tensor_parallel(model, dm["tp"], sequence_parallel)
    if mesh.dp.size > 1:
        apply_fully_shard(model, dm, reshard_after_forward)
    model.device_mesh, model.mesh = dm, mesh
    return model
