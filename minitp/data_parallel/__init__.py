"""Data parallelism and ZeRO: every dp rank works on its slice of the batch, and the
ranks sum their gradients — with the optimizer state (stage 1), the gradients (2)
and the parameters (3) sharded over dp as well.

* `grad_sync`: the bucketed gradient all-reduce started from backward hooks.
* `zero_stage1`: `Zero1Optimizer`, the optimizer state sharded.
* `zero_units`: the units ZeRO-2/3 cut a stage into, and their shards.
* `zero_stage2`, `zero_stage3`: each unit's gradient reduce-scattered during
  backward; its parameters gathered just before use.
* `zero`: attaching the chosen stage to a model, and `make_optimizer`.
"""

from .grad_sync import GradSync
from .zero import attach_data_parallel, gathered, make_optimizer
from .zero_stage1 import Zero1Optimizer

__all__ = ["GradSync", "Zero1Optimizer", "attach_data_parallel", "gathered", "make_optimizer"]
