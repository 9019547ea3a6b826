"""Exercise 09: which K/V heads a tensor-parallel rank holds, who shares them, and where
a context-parallel rank's tokens sit.

Grouped-query attention (lesson 09) gives n_head query heads only n_kv K/V heads, each
shared by a group of n_head/n_kv query heads. Tensor parallelism gives each of tp ranks
n_head/tp whole query heads — and the K/V heads those query heads read:

* tp dividing n_kv: each rank holds its own n_kv/tp K/V heads, as it does its query heads;
* tp above n_kv (a multiple of it): a K/V head serves the query heads of tp/n_kv ranks,
  so each of those ranks holds a copy, and the copies' gradients must be summed over
  exactly those ranks — no more, no fewer.

Rotary positions turn q and k by each token's position; under context parallelism a
rank's tokens are not positions 0, 1, 2, ... Lesson 08's load-balanced split cuts the
sequence into 2·cp equal chunks and gives each cp rank two of them, in increasing order,
chosen so that under the causal mask every rank does the same attention work (a late
token attends to more than an early one).

Write, with plain integer arithmetic (the grader compares with the model minitp builds):

* `kv_heads_of(tp_rank, tp, n_head, n_kv)`: the K/V heads (global indices, increasing)
  that rank `tp_rank`'s query heads read;
* `sharing_ranks(tp_rank, tp, n_head, n_kv)`: the tp ranks (increasing) whose query heads
  read the same K/V heads as `tp_rank`'s: the group its K/V gradient is summed over
  (itself alone when tp divides n_kv);
* `rope_positions(length, cp_rank, cp)`: the global positions of the `length` tokens cp
  rank `cp_rank` holds, in the order it holds them.

Grade it with `mt.grade("ex09")` in a notebook or `python -m minitp.course.grade ex09`.
"""


def kv_heads_of(tp_rank: int, tp: int, n_head: int, n_kv: int) -> list[int]:
    """The K/V heads rank `tp_rank`'s query heads read."""
    # BEGIN SOLUTION
    # hint: Which query heads does rank tp_rank hold? The n_head query heads share the
    # hint: n_kv K/V heads in equal groups of neighbours: which K/V head does each of yours
    # hint: read? What happens when a rank holds fewer query heads than a group?
    per_rank, group = n_head // tp, n_head // n_kv
    heads = range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    return sorted({h // group for h in heads})
    # END SOLUTION


def sharing_ranks(tp_rank: int, tp: int, n_head: int, n_kv: int) -> list[int]:
    """The tp ranks whose query heads read the same K/V heads as `tp_rank`'s."""
    # BEGIN SOLUTION
    # hint: Whose query heads add terms to the gradient of the K/V heads this rank holds?
    # hint: Can a function you have already written tell you?
    mine = kv_heads_of(tp_rank, tp, n_head, n_kv)
    return [r for r in range(tp) if kv_heads_of(r, tp, n_head, n_kv) == mine]
    # END SOLUTION


def rope_positions(length: int, cp_rank: int, cp: int) -> list[int]:
    """Global positions of the `length` tokens cp rank `cp_rank` holds."""
    # BEGIN SOLUTION
    # hint: How long is a chunk, if a rank holds `length` tokens in two of them? Which
    # hint: pairs of chunks cost every rank the same causal work (pair a cheap one with
    # hint: a dear one)? Not 0, 1, 2, ... on every rank: that is the trap.
    chunk = length // 2
    return [k * chunk + j for k in (cp_rank, 2 * cp - 1 - cp_rank) for j in range(chunk)]
    # END SOLUTION
