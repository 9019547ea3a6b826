"""Context parallelism: the sequence split across the cp ranks everywhere, attention included.

* `split`: the load-balanced split (2·cp chunks, rank r holding chunks r and
  2·cp − 1 − r, so causal attention's work is even) and its inverse.
* `ring`: ring attention, each rank's queries meeting every rank's keys and
  values, merged by online softmax (`merge_partials`).
* `allgather`: K and V gathered once over cp, each rank's queries against all of them
  (kept for backward, or gathered again there: TransformerEngine's);
* `latent`: latent attention's all-gather: its latent and rotary key gathered, not K/V;
* `ulysses`: the all-to-all that trades the sequence split for a head split (Ulysses),
  and its hybrid with the ring (USP);
* `plan`: the plan table that makes a plain GPT context-parallel, by ``cp_comm``;
* `packed`: packed documents under cp: the split's work counted per document, and
  packing's two traps (positions that do not restart, a mean of the ranks' means).
"""

from . import packed
from .allgather import AllGatherAttention, allgather_attention
from .plan import CONTEXT_PARALLEL_PLAN, apply_context_parallel, attention_axes
from .ring import merge_partials, ring_attention
from .split import (
    chunk_order,
    gather_sequence,
    global_positions,
    merge_sequence,
    split_sequence,
)
from .ulysses import UlyssesAttention, heads_to_sequence, hybrid_axes, sequence_to_heads

__all__ = ["CONTEXT_PARALLEL_PLAN", "AllGatherAttention", "UlyssesAttention",
           "allgather_attention", "apply_context_parallel", "attention_axes", "chunk_order",
           "gather_sequence", "global_positions", "heads_to_sequence", "hybrid_axes",
           "merge_partials", "merge_sequence", "packed", "ring_attention", "sequence_to_heads",
           "split_sequence"]
