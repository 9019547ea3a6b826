"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and sequence parallelism
(Korthikanti et al. 2022): each layer's weights split over the tp ranks.

* `mappings`: the conjugate pairs (identity forward / all-reduce backward, and the
  sequence-parallel gathers and scatters), the only place tp communication happens.
* `layers`: `ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding`.
* `loss`: `vocab_parallel_cross_entropy`, without gathering the logits.
* `plan`: the plan tables that make a plain GPT tensor- (and sequence-) parallel.
* `partial_grads`: summing the gradients sequence parallelism leaves partial.
* `dropout`: the same mask where activations are replicated, a different one where split.
* `overlap`: the collective matmul (communication overlapped with compute).
* `two_d`: `Linear2D`, one linear layer on a q × q grid of ranks (SUMMA).
"""

from . import mappings
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .loss import vocab_parallel_cross_entropy
from .plan import apply_tensor_parallel
from .two_d import Linear2D

__all__ = ["ColumnParallelLinear", "Linear2D", "RowParallelLinear", "VocabParallelEmbedding",
           "apply_tensor_parallel", "mappings", "vocab_parallel_cross_entropy"]
