"""What happens to the gradients between the last backward of a step and the optimizer
step, in order, in one place (Megatron-Core's ``finalize_model_grads`` is the model).

During backward each stage has already posted its data-parallel reductions (bucketed
all-reduces, or ZeRO-2/3's per-unit reduce-scatters); what is left is to wait for
them and to sum what the other axes left partial. ZeRO-1 is the one exception: its
reduce-scatter of the flat gradient is part of its optimizer's ``step()``
(`minitp.data_parallel.Zero1Optimizer`), since the shard it produces is what it steps.
"""

from __future__ import annotations

from ..data_parallel.zero import finish_sharded_grads, zero_stage_of
from ..rules import model_chunks
from ..runtime.mesh import Mesh


def finalize_grads(model, mesh: Mesh) -> None:
    """Make every gradient this rank's optimizer reads the whole step's true gradient."""
    # 1. Data parallelism (dp×cp): wait for the reductions backward posted, bucket by
    #    bucket or unit by unit; after this the dp replicas agree.
    for chunk in model_chunks(model):
        if chunk.grad_sync is not None:
            chunk.grad_sync.finish()
    if zero_stage_of(model) >= 2:
        # 2'. ZeRO-2/3: the gradients live in dp shards; steps 3 and 4 below happen
        #     there, on the shards' elements (`minitp.data_parallel.zero.finish_sharded_grads`).
        finish_sharded_grads(model, mesh)
        return
    # 3. Sequence parallelism: the gradients of parameters that every tp rank applied to
    #    its own part of the sequence (LayerNorms, row-parallel biases) are partial
    #    sums; add them over tp.
    model.sync_partial_grads()
    # 4. Pipeline parallelism: the tied embedding has a copy on the first and the last
    #    stage, each with the gradient of its own use; both take their sum.
    if hasattr(model, "sync_embedding_grads"):
        model.sync_embedding_grads()
