"""Context parallelism: the sequence split across the cp ranks everywhere, attention included.

* `split`: the load-balanced split (2·cp chunks, rank r holding chunks r and
  2·cp − 1 − r, so causal attention's work is even) and its inverse.
* `ring`: ring attention, each rank's queries meeting every rank's keys and
  values, merged by online softmax (`merge_partials`).
* `plan`: the plan table that makes a plain GPT context-parallel.
"""

from .plan import CONTEXT_PARALLEL_PLAN, apply_context_parallel
from .ring import merge_partials, ring_attention
from .split import (
    chunk_order,
    gather_sequence,
    global_positions,
    merge_sequence,
    split_sequence,
)

__all__ = ["CONTEXT_PARALLEL_PLAN", "apply_context_parallel", "chunk_order", "gather_sequence",
           "global_positions", "merge_partials", "merge_sequence", "ring_attention",
           "split_sequence"]
