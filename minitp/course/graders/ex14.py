"""Checks for ex14: what each rank writes and reads when a ZeRO-1, tp = 2 checkpoint is
loaded at tp = 1 (lesson 14), in the format of `minitp.checkpoint.sharded`: one file per
rank, each element written once, by the lowest global rank that holds it.

The reference is built from minitp's own layout, not from the exercise's arithmetic: a
plain GPT whose every element holds its own number is sharded by the tensor-parallel plan
(`minitp.tensor_parallel.plan.apply_tensor_parallel`, on an axis of the grader's making:
building the layers slices, it sends nothing) and each tp rank's parameters are cut by
ZeRO-1's own `FlatShard`; the numbers read back say which ranks hold each element, the
lowest of them writes it. The new layout (tp 1, ZeRO-1 over dp) is `FlatShard` over the
plain GPT's parameters. No process is launched.

On two models and layouts (tp 2, dp 2 → tp 1, dp 4, the lesson's; and tp 2, dp 3 → tp 1,
dp 2, with padding in every flat vector):

* tp_block: each tp rank's block of every parameter;
* state_owner: the rank that writes each element's Adam state;
* writes: each old rank writes exactly its reference file (every element once);
* reads: each new rank gets its whole model and its ZeRO-1 shard, each element from the
  file that holds it;
* reads: only the bytes it needs, each once (counted in float32).

Named slips: the split taken on the wrong dimension; a state placed in the wrong dp
rank's shard; a holder that is not the lowest; a replica (another dp rank, or for a
replicated parameter another tp rank) writing what another already wrote; every dp rank
writing all of its tp rank's optimizer state; every rank reading whole files.

Its parts: ex14_layout.py (the reference), ex14_answers.py (the learner's answers read),
ex14_checks.py (the five checks); this module runs them.
"""

from __future__ import annotations

from .base import Check
from .ex14_answers import _Failed
from .ex14_checks import (
    NAMES,
    _check_blocks,
    _check_bytes,
    _check_owners,
    _check_reads,
    _check_writes,
)
from .ex14_layout import CASES, Layout, _layout, rank_file

__all__ = ["CASES", "NAMES", "Layout", "_layout", "rank_file", "run"]


def run(module) -> list[Check]:
    return [_guard(NAMES[0], lambda: _check_blocks(module)),
            _guard(NAMES[1], lambda: _check_owners(module)),
            _guard(NAMES[2], lambda: _check_writes(module)),
            _guard(NAMES[3], lambda: _check_reads(module)),
            _guard(NAMES[4], lambda: _check_bytes(module))]


def _guard(name: str, check) -> Check:
    try:
        return check()
    except _Failed as failed:
        return Check(name, False, failed.detail, hint=failed.hint)
