"""The same GPT parallelized by PyTorch's own parallelism: DTensor tensor parallelism,
FSDP2 and HSDP on a DeviceMesh made from minitp's `Mesh` (docs/torch-parallel.md).

    model = mt.torch_parallel.parallelize(ref, mesh, sequence_parallel=True, hsdp=None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = mt.torch_parallel.train_step(model, batch, opt)

device_mesh (Mesh -> DeviceMesh), tp_plan (the parallelize_module plan), fsdp
(fully_shard, HSDP), step (the train step), measure (bytes and peaks beside ZeRO-3).
"""

from .device_mesh import device_mesh
from .parallelize import parallelize
from .step import full_state_dict, train_step
from .tp_plan import block_plan, model_plan

__all__ = ["block_plan", "device_mesh", "full_state_dict", "model_plan", "parallelize",
           "train_step"]
