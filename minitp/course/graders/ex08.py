"""Checks for ex08: the online-softmax merge, the load-balanced split, one step of ring
attention, and one block's backward.

(a) `merge`, in this process, float64, against the softmax over all the keys
(torch's own, on the whole score matrix): ordinary scores split unevenly between
two blocks; scores near +1000 and −1000 (e^1000 overflows float64: the merge must
subtract before it exponentiates); an empty partial (ℓ = −inf, O = 0), which
must change nothing; and no call to `minitp.context_parallel.merge_partials`.
Plain averaging of the two outputs is named.

(b) `chunks_of` and `split`, in this process, at cp = 2 and 4, every rank: the two
chunks (of 2·cp) rank r holds, r and 2·cp − 1 − r, early one first, cut out of a
float64 tensor, and their positions in the whole sequence. Named: a contiguous
split, the late chunk first, positions counted from 0 on every rank.

(c) `ring_step` at cp = 2 and 4 on real processes, float64, the load-balanced split
(this grader's own, so (c) does not depend on (b)'s answer): every rank starts at
out = 0, ℓ = −inf and calls the learner's step cp times.
* The trace: every step sends K and V to ``axis.next`` and returns the block it
  received (rank r−s−1's) — except after the last step, where c − 1 hops suffice
  and a ring that skips the last (useless) one is as right as one that makes it.
* After each step s, the running (out, ℓ) must be the attention over the blocks of
  ranks r, r−1, …, r−s: each of the rank's two query chunks against each key chunk
  that arrived, whole if the key chunk lies before, the causal triangle if it is
  the same chunk, nothing if it lies after. A wrong result is matched against what
  each usual mistake gives, folded step by step in float64: chunks numbered as a
  contiguous split; each query chunk paired with the same-numbered key chunk only;
  the block's two key chunks swapped; a later chunk attended; the diagonal chunk
  without its triangle; the block taken for rank r+s's, fetched from the wrong side,
  or both (the ring turned the wrong way).
* After cp steps, causal attention over the whole sequence computed on one process.
* The work: every call of the learner's `block_attention` is counted, in
  (chunk × chunk) blocks; each rank must compute the same, at least the 2·cp + 1 the
  causal mask keeps. More passes when the results are right (one masked 2L × 2L call
  a step computes 4·cp: balanced, the lesson's point), its waste said.
* The backward. The exercise's functions are forward-only (minitp's ring makes its own
  backward ring, sending dK and dV home); what is checked is autograd through the
  learner's steps, once the forward is right: every block a rank held enters its step
  as a leaf, sum(out · w) is differentiated on each rank, and q's gradient must equal
  causal attention's (one process, float64) there, and each block's gradient, this
  rank's share, summed over the ranks it visited (home, at its owner), must equal its
  owner's dK, dV. Named: a running (out, lse) written in place (autograd saved it for
  the merge's backward), a step that cut the graph (no gradient at all).

(d) `block_backward`, in this process, float64: the backward the learner writes, one
block's (dq, dk, dv) recomputed from the final lse, called block by block and summed
where the rows belong (dK and dV home to their keys, as the ring's backward carries
them), against torch autograd through the whole attention: keys cut into two uneven
blocks; causal attention as two triangles and a whole block; scores near ±1000. Any
way that sums right passes; named: each block normalised by its own softmax (or
differentiated as an attention of its own), the softmax's D term dropped or summed
over the block alone, the 1/√d forgotten, the diagonal block unmasked, an overflow.

Each part is a module of its own: ex08_merge.py (a), ex08_split.py (b), ex08_ring.py
(c) on the ranks and ex08_ring_checks.py (c)'s judgements, ex08_backward.py (d); this
one runs them.
"""

from __future__ import annotations

from ...runtime.launch import launch
from .base import Check, run_per_size
from .ex08_backward import grade_backward
from .ex08_merge import grade_merge
from .ex08_ring import _in_rank
from .ex08_ring_checks import _backward, _final, _passing, _steps, _work
from .ex08_split import grade_split

WORLD_SIZES = (2, 4)


def _names(n) -> list[str]:
    return [f"cp={n}: each step (the last may skip it) sends K and V to axis.next and "
            "returns rank r-s-1's block",
            f"cp={n}: after each step s, (out, lse) is the attention over the blocks of ranks "
            "r, r-1, .., r-s",
            f"cp={n}: after {n} steps, equals causal attention over the whole sequence",
            f"cp={n}: every rank computes the same work, at least the {2 * n + 1} "
            "(chunk x chunk) blocks the causal mask keeps",
            f"cp={n}: backward through the steps: the gradients of q, and of K and V summed "
            "at their owner, equal causal attention's"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_passing(names[0], per_rank, n), _steps(names[1], per_rank, n),
            _final(names[2], per_rank), _work(names[3], per_rank, n),
            _backward(names[4], per_rank, n)]


def run(module) -> list[Check]:
    checks = grade_merge(module.merge) + grade_split(module.chunks_of, module.split)

    def launch_at(n):
        return launch(_in_rank, n, module.ring_step, timeout=20.0)

    return (checks + run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="ring_step",
                                  size="cp")
            + grade_backward(module.block_backward))
