"""PyTorch's own answers for ex25, found on the ranks: the Llama block under the plan of
`pytorch/tutorials`' `intermediate_source/TP_tutorial.rst` (with sequence parallelism) and
FSDP2, on meshes (dp, tp) of 4 ranks, and DTensor's local shapes for the shape cases.
Nothing of the learner's runs here."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

WORLD = 4
VOCAB, DIM, KV, HIDDEN = 49, 8, 4, 24  # an odd vocabulary; 2 key/value heads of 2
SHAPES = {"tok_embeddings.weight": (VOCAB, DIM), "layers.0.attention_norm.weight": (DIM,),
          **{f"layers.0.attention.{w}.weight": (o, DIM)
             for w, o in (("wq", DIM), ("wk", KV), ("wv", KV))},
          "layers.0.attention.wo.weight": (DIM, DIM), "layers.0.ffn_norm.weight": (DIM,),
          "layers.0.feed_forward.w1.weight": (HIDDEN, DIM),
          "layers.0.feed_forward.w2.weight": (DIM, HIDDEN),
          "layers.0.feed_forward.w3.weight": (HIDDEN, DIM),
          "norm.weight": (DIM,), "output.weight": (VOCAB, DIM)}
SP = "layers.0.attention_norm", "layers.0.ffn_norm", "norm"
PLAN = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        **{n: SequenceParallel() for n in SP},
        **{f"layers.0.{m}": ColwiseParallel() for m in (
            "attention.wq", "attention.wk", "attention.wv", "feed_forward.w1",
            "feed_forward.w3")},
        **{f"layers.0.{m}": RowwiseParallel(output_layouts=Shard(1)) for m in (
            "attention.wo", "feed_forward.w2")},
        "output": ColwiseParallel(input_layouts=Shard(1), use_local_output=False)}
MESHES = ((1, 4), (2, 2), (4, 1))  # (dp, tp), tp fastest
# (global shape, placements, mesh shape): uneven, empty, a negative dim, replicated, a dim
# sharded by both mesh dimensions (6 rows tell the mesh's order from its reverse)
CASES = (((5, 3), (Shard(0),), (4,)), ((6, 3), (Shard(1),), (4,)),
         ((8, 6), (Shard(-1),), (4,)), ((7,), (Replicate(),), (4,)),
         ((6, 5), (Shard(0), Shard(0)), (2, 2)), ((5, 3), (Shard(1), Shard(0)), (2, 2)),
         ((4, 6), (Replicate(), Shard(1)), (2, 2)))


def block_on() -> nn.Module:
    """The block, one device, float64: an Embedding, RMSNorms and bias-free Linears named
    as SHAPES names them."""
    torch.manual_seed(22)
    root = nn.Module()
    for name, shape in SHAPES.items():
        *path, leaf, _ = name.split(".")
        parent = root
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        if leaf == "tok_embeddings":
            module = nn.Embedding(*shape, dtype=torch.float64)
        elif leaf.endswith("norm"):
            module = nn.RMSNorm(shape[0], dtype=torch.float64)
        else:
            module = nn.Linear(shape[1], shape[0], bias=False, dtype=torch.float64)
        parent.add_module(leaf, module)
    return root


def key(p, ndim: int) -> str:
    """A placement as its name, Shard's dim made non-negative: Shard(-1) of a matrix is
    Shard(1)."""
    if isinstance(p, Shard):
        return f"Shard({p.dim + ndim if p.dim < 0 else p.dim})"
    return type(p).__name__ + "()"


def in_rank():
    """Runs on every rank: the placements (tp = 4), the bytes held on each mesh of MESHES
    with this rank's (dp, tp) coordinate, and each case's local shape."""
    ranks, meshes = torch.arange(dist.get_world_size()), {}

    def mesh_of(shape):  # one DeviceMesh (and its process groups) per shape
        if shape not in meshes:
            meshes[shape] = DeviceMesh("cpu", ranks.reshape(shape), mesh_dim_names=(
                ("dp", "tp") if len(shape) == 2 else ("tp",)))
        return meshes[shape]

    out = {"bytes": []}
    for dp, tp in MESHES:
        mesh = mesh_of((dp, tp))
        block = block_on()
        if tp > 1:
            parallelize_module(block, mesh["tp"], PLAN)
        if dp > 1:
            fully_shard(block, mesh=mesh["dp"])
        if (dp, tp) == (1, WORLD):
            out["placements"] = {n: key(p.placements[0], p.dim())
                                 for n, p in block.named_parameters()}
        held = sum(p.to_local().numel() * p.element_size() for p in block.parameters())
        out["bytes"].append((tuple(mesh.get_coordinate()), held))
    out["shapes"] = []
    for shape, placements, mesh_shape in CASES:
        mesh = mesh_of(mesh_shape)
        piece = distribute_tensor(torch.zeros(shape), mesh, list(placements)).to_local()
        out["shapes"].append((tuple(mesh.get_coordinate()), tuple(piece.shape)))
    return out
