"""Expert parallelism: a mixture of experts' experts shared out over the ep ranks
folded into data parallelism, tokens carried to them and back by all-to-all.

Public names: `apply_expert_parallel` (step of `mt.parallelize`), `AllToAllDispatch`,
`SplitSequence` (the groups routing statistics are reduced over), `shard_experts`. The
one-device layer: `minitp.model.moe`, `minitp.model.routing`.
"""

from .dispatch import AllToAllDispatch, all_to_all, source_to_expert_major
from .plan import (
    SplitSequence,
    apply_expert_parallel,
    shard_experts,
)
from .work import expert_work

__all__ = ["AllToAllDispatch", "SplitSequence", "all_to_all", "apply_expert_parallel",
           "expert_work", "shard_experts", "source_to_expert_major"]
