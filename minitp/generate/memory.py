"""What `python -m minitp.generate` will hold, a MODEL read before any process starts, so
that a batch the machine cannot hold is refused in one line (as `minitp.train` refuses a
run: `minitp.train.machine`'s `available_memory` and `too_big`), not by a rank's
"can't allocate memory" traceback.

Per rank, in the run's dtype (w bytes a value): three copies of every parameter (the
dense checkpoint as loaded, its cast, and `mt.parallelize`'s copy before it shards); the
KV cache, seq_len positions of every sequence for this rank's heads and stage
(`calc.kv_cache_bytes_per_token`); one forward's working set, at most seq_len positions
of a group (`calc.activation_bytes_per_layer`, Korthikanti's 2-byte count scaled to w,
and every position's logits, V/tp of them); and every step's whole logits kept in
float64 (B·V·8 a step, on the CPU even where the ranks run on GPUs), twice (the list and
the stack sent back). With --check, the parent's reference: the dense model twice, its
uncached forward, its logits and the ones received. Python's and torch's own ~0.3 GB a
process are left out: the check is for runs that cannot fit, not a close call.
"""

from __future__ import annotations

import torch

from .. import calc
from ..rules import ceil_div
from ..train.machine import on_gpus


def memory_needed(args, cfg) -> dict:
    """``{"per_rank", "ranks", "machine"}`` bytes (the model above)."""
    w = torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
    ranks = args.tp * args.pp
    rows = ceil_div(args.batch, min(args.batch, args.pp))  # the largest group in flight
    weights = 3 * calc.exact_param_count(cfg) * w
    cache = args.batch * cfg.seq_len * calc.kv_cache_bytes_per_token(cfg, w, args.tp) / args.pp

    def working(rows: int, tp: int) -> float:  # one forward of seq_len positions
        layer = calc.activation_bytes_per_layer(cfg, rows, tp) * w / 2
        return layer + rows * cfg.seq_len * cfg.vocab_size / tp * w

    kept = 2 * args.tokens * args.batch * cfg.vocab_size * 8
    per_rank = weights + cache + working(rows, args.tp) + kept
    # on GPUs the host keeps each rank's dense load and the logits (copied to the CPU)
    host = ranks * (weights + kept if on_gpus(ranks) else per_rank)
    if args.check:
        host += 2 * calc.exact_param_count(cfg) * w + working(rows, 1) + 2 * kept
    return {"per_rank": per_rank, "ranks": ranks, "machine": host}
