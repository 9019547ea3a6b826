"""Exercise 09: which K/V heads a tensor-parallel rank holds, who shares them, and where
a context-parallel rank's tokens sit.

Grouped-query attention (lesson 09) gives n_head query heads only n_kv K/V heads, each
shared by a group of n_head/n_kv query heads. Tensor parallelism gives each of tp ranks
n_head/tp whole query heads — and the K/V heads those query heads read:

* tp dividing n_kv: each rank holds its own n_kv/tp K/V heads, as it does its query heads;
* tp above n_kv (a multiple of it): a K/V head serves the query heads of tp/n_kv ranks,
  so each of those ranks holds a copy, and the copies' gradients must be summed over
  exactly those ranks — no more, no fewer.

Rotary positions turn q and k by each token's position; under context parallelism with
the load-balanced split (lesson 08: cp rank i holds chunks i and 2·cp−1−i of 2·cp equal
chunks), a rank's tokens are not positions 0, 1, 2, ...

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
    # hint: query head h reads K/V head h // (n_head // n_kv). Which query heads does
    # hint: rank tp_rank hold (n_head // tp of them, in order)? Collect their K/V heads.
    per_rank, group = n_head // tp, n_head // n_kv
    heads = range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    return sorted({h // group for h in heads})
    # END SOLUTION


def sharing_ranks(tp_rank: int, tp: int, n_head: int, n_kv: int) -> list[int]:
    """The tp ranks whose query heads read the same K/V heads as `tp_rank`'s."""
    # BEGIN SOLUTION
    # hint: two ranks share when their kv_heads_of(...) are the same list; when tp
    # hint: divides n_kv every rank's list is its own.
    mine = kv_heads_of(tp_rank, tp, n_head, n_kv)
    return [r for r in range(tp) if kv_heads_of(r, tp, n_head, n_kv) == mine]
    # END SOLUTION


def rope_positions(length: int, cp_rank: int, cp: int) -> list[int]:
    """Global positions of the `length` tokens cp rank `cp_rank` holds."""
    # BEGIN SOLUTION
    # hint: the sequence is cut into 2·cp chunks of length // 2 tokens; rank i holds
    # hint: chunk i, then chunk 2·cp - 1 - i. Not 0, 1, 2, ...: that is the trap.
    chunk = length // 2
    return [k * chunk + j for k in (cp_rank, 2 * cp - 1 - cp_rank) for j in range(chunk)]
    # END SOLUTION
