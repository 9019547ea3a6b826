"""Lab: packed documents under context parallelism (lesson 10's last section).

`packed_side_by_side`: one launch of `world_size` ranks, ``Mesh(cp=world_size)``. The same
plain GPT (float64) takes one training step on one packed batch (x, y, positions) with each
variant of `VARIANTS`; per rank and variant, the step's loss and the largest difference of
any gradient from the plain GPT's on the same packed batch (MEASURED), and how many targets
this rank's part of the batch counts.
"""

from __future__ import annotations

import torch

VARIANTS = (("ring", None), ("allgather", None), ("a2a", None))


def _in_rank(cfg, x, y, positions):
    from ... import context_parallel as cpar
    from ...data_parallel import make_optimizer
    from ...model import GPT
    from ...parallelize import parallelize
    from ...rules import IGNORE_INDEX
    from ...runtime._device import device
    from ...runtime.mesh import Mesh, world
    from ...step import train_step

    mesh = Mesh(cp=world().size)
    torch.manual_seed(0)
    ref = GPT(cfg).to(device=device(), dtype=torch.float64)
    x, y, positions = (t.to(device()) for t in (x, y, positions))
    ref.zero_grad()
    ref_loss = ref(x, y, positions=positions)[1]
    ref_loss.backward()
    counted = int((cpar.split_sequence(y, mesh.cp) != IGNORE_INDEX).sum())
    out = {}
    for comm, u in VARIANTS:
        model = parallelize(ref, mesh, cp_comm=comm, cp_a2a_size=u)
        opt = make_optimizer(model, mesh, torch.optim.SGD, lr=0.0)
        loss = train_step(model, (x, y, positions), mesh, opt)
        grads = model.full_grad_dict()
        grad_error = max((grads[n] - p.grad).abs().max().item()
                         for n, p in ref.named_parameters())
        out[comm] = {"loss": loss, "loss_error": abs(loss - ref_loss.item()),
                     "grad_error": grad_error}
    return {"variants": out, "counted": counted, "one_device": ref_loss.item()}


def packed_side_by_side(cfg, x, y, positions, world_size: int = 2, timeout: float = 120.0):
    """Per rank: ``{"variants": {comm: {"loss", "loss_error", "grad_error"}}, "counted",
    "one_device"}`` (see the module)."""
    from ...runtime.launch import launch

    return list(launch(_in_rank, world_size, cfg, x, y, positions, timeout=timeout))
