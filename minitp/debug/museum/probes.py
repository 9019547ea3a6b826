"""The museum's bugs that live outside one training step of the GPT: each probe runs on
every rank of a world of 4, spoiled or fixed, and returns how far this rank lands from
one device (``{"departure": max abs difference}``). What one device computes is computed
here too, in this process, from the same seeds every rank uses.
"""

from __future__ import annotations

import torch

from ...data_parallel import make_optimizer
from ...fp8.block_shards import gather_cast
from ...model import GPT, GPTConfig
from ...optim.newton_schulz import newton_schulz, newton_schulz_tp
from ...parallelize import parallelize
from ...runtime import comm
from ...runtime._device import device
from ...runtime.mesh import Mesh
from ...sharding.tags import tag
from ...step import train_step

SEED = 0
TINY = dict(vocab_size=61, seq_len=16, n_layer=2, n_head=4, d_model=32)


def _local_grads(world: int, shape=(8, 12)) -> list[torch.Tensor]:
    """Every rank's own (unreduced) gradient of one matrix: rank r's from seed r."""
    return [torch.randn(shape, generator=torch.Generator().manual_seed(SEED + r),
                        dtype=torch.float64).to(device()) for r in range(world)]


def muon_partial_gradient(fixed: bool) -> dict:
    """ZeRO's reduce-scatter leaves each rank the sum on its slice of the flat gradient
    only; Newton–Schulz of that patchwork (spoiled), or of the all-gathered sum (fixed)."""
    axis = Mesh(dp=4).dp
    grads = _local_grads(axis.size)
    mine = grads[axis.rank]
    flat = mine.reshape(-1)
    size = flat.numel() // axis.size
    reduced = comm.reduce_scatter(flat, axis)  # the sum, on my slice
    if fixed:
        held = comm.all_gather(reduced, axis).view_as(mine)
    else:
        held = flat.clone()
        held[axis.rank * size:(axis.rank + 1) * size] = reduced
        held = held.view_as(mine)
    true = newton_schulz(torch.stack(grads).sum(0))
    return {"departure": float((newton_schulz(held) - true).abs().max())}


def muon_row_shard(fixed: bool) -> dict:
    """A tp rank's row block of a gradient orthogonalised alone (spoiled), or with the
    Gram matrix summed over tp (`newton_schulz_tp`, fixed)."""
    axis = Mesh(tp=4).tp
    whole = _local_grads(1, (16, 8))[0]
    block = whole.chunk(axis.size, 0)[axis.rank]
    mine = newton_schulz_tp(block, 0, axis) if fixed else newton_schulz(block)
    part = newton_schulz(whole).chunk(axis.size, 0)[axis.rank]
    return {"departure": float((mine - part).abs().max())}


def mxfp8_block_boundary(fixed: bool) -> dict:
    """ZeRO-3's 8-bit all-gather of an MXFP8 weight: each dp rank casts its shard before
    it travels; the even split cuts blocks of 32 in two (spoiled), block-atomic shards
    do not (fixed)."""
    axis = Mesh(dp=4).dp
    weight = _local_grads(1, (5, 64))[0]  # 320 values: 80 a rank, boundaries mid-block
    return {"departure": gather_cast(weight, axis, "mxfp8", atomic=fixed)["max_error"]}


def dropout_seed_per_rank(fixed: bool) -> dict:
    """Dropout on at tp = 4 without SP: the residual stream is replicated, so its masks
    must be the same on every tp rank (`ShardedDropout` then offsets the heads' seed by
    rank). Seeding each rank by its rank (spoiled) drops different elements of the same
    activations; the replicated parameters' gradients part, which one device's never do.
    Returns the largest spread of a replicated gradient across the tp ranks."""
    mesh = Mesh(tp=4)
    torch.manual_seed(SEED)
    model = parallelize(GPT(GPTConfig(**TINY, dropout=0.25)).to(device(), torch.float64), mesh)
    gen = torch.Generator().manual_seed(SEED)
    batch = tuple(torch.randint(0, TINY["vocab_size"], (2, TINY["seq_len"]), generator=gen)
                  .to(device()) for _ in range(2))
    torch.manual_seed(SEED if fixed else SEED + mesh.tp.rank)
    train_step(model, batch, mesh, make_optimizer(model, mesh, torch.optim.SGD, lr=0.0))
    copies = torch.cat([p.grad.reshape(-1) for p in model.parameters()
                        if tag(p, "tp_split_dim") is None and p.grad is not None])
    every = comm.all_gather(copies.unsqueeze(0), mesh.tp)
    return {"departure": float((every - every[0]).abs().max())}


def uneven_steps(fixed: bool) -> dict:
    """dp = 4 over a dataset whose shards are uneven: rank 3's runs out one step early
    (spoiled) and it returns while the others wait in the next step's gradient all-reduce;
    the fix: every rank the same number of steps (the remainder dropped)."""
    mesh = Mesh(dp=4)
    torch.manual_seed(SEED)
    model = parallelize(GPT(GPTConfig(**TINY)).to(device(), torch.float64), mesh)
    optimizer = make_optimizer(model, mesh, torch.optim.SGD, lr=0.1)
    gen = torch.Generator().manual_seed(SEED)
    steps = 2 if fixed or mesh.dp.rank != 3 else 1
    for _ in range(steps):
        batch = tuple(torch.randint(0, TINY["vocab_size"], (4, TINY["seq_len"]), generator=gen)
                      .to(device()) for _ in range(2))
        train_step(model, batch, mesh, optimizer)
    return {"departure": 0.0}
