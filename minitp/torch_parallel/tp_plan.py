"""Tensor parallelism by PyTorch's DTensor: the `parallelize_module` plan for minitp's GPT.

The same Megatron split as `minitp.tensor_parallel.plan`, written in torch's styles:

    minitp (`mt.parallelize`)                 torch (`parallelize_module` plan)
    ColumnParallelLinear  attn.qkv, mlp.fc    ColwiseParallel()        weight Shard(0)
    RowParallelLinear     attn.proj, mlp.proj RowwiseParallel()        weight Shard(1)
    VocabParallelEmbedding wte                RowwiseParallel(input_layouts=Replicate())
    vocab_parallel_cross_entropy              loss_parallel() over logits Shard(-1)
    sequence_parallel=True                    SequenceParallel() on ln1, ln2, ln_f;
                                              PrepareModuleInput(Shard(1) -> Replicate())
                                              on attn and mlp (the all-gather);
                                              RowwiseParallel(output_layouts=Shard(1))
                                              (the reduce-scatter)

`nn.Linear` stores its weight (out, in), so a column split (of the outputs) is Shard(0)
and a row split (of the inputs) Shard(1); the embedding's (vocab, d_model) weight split
by vocabulary rows is torch's RowwiseParallel of an embedding.

The tied output. minitp's head computes x · Eᵀ with the embedding's own weight. Once
RowwiseParallel has made that weight a DTensor sharded by vocabulary (Shard(0)), the head
needs no style of its own: `PrepareModuleInput` hands it x as a Replicate DTensor, and
DTensor's matmul of Replicate by Shard(0)ᵀ gives logits sharded by vocabulary, Shard(-1)
— exactly minitp's vocab-parallel logits, never gathered. The loss is then torch's
``F.cross_entropy`` inside ``loss_parallel()``, which is minitp's vocab-parallel
cross-entropy (a max, a sum of exponentials and the target logit, each all-reduced over tp).

One difference under SP: minitp's embedding reduce-scatters into sequence shards and the
learned positions are added to each shard; here the embedding all-reduces (Replicate
output), the positions are added to the whole sequence on every tp rank, and the first
block's input is cut into sequence shards locally (no communication). Torch's styles have
no place for a learned-positions module fed a sequence shard: ``LearnedPositions`` reads T
from its input.
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def block_plan(sequence_parallel: bool) -> dict:
    """One transformer block's plan, keyed by the block's module names."""
    if not sequence_parallel:
        return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"ln1": SequenceParallel(), "attn": gather, "attn.qkv": ColwiseParallel(),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(), "mlp": gather, "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(output_layouts=Shard(1))}


def model_plan(sequence_parallel: bool) -> dict:
    """The plan outside the blocks: embedding, final norm, tied head."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan = {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "head": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                       use_local_output=False)}
    if sequence_parallel:
        plan["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                              desired_input_layouts=(Shard(1),),
                                              use_local_output=True)
        plan["ln_f"] = SequenceParallel()
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """`model` (a plain minitp GPT, changed in place) split over `tp_mesh` by the plans above."""
    parallelize_module(model, tp_mesh, model_plan(sequence_parallel))
    for block in model.blocks:
        parallelize_module(block, tp_mesh, block_plan(sequence_parallel))
