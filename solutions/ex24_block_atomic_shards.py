"""Exercise 24: block-atomic shards — where ZeRO-3 may cut a weight that travels in MXFP8
or NVFP4.

ZeRO-3 (lesson 21) flattens a unit's parameters into one vector of `numel` values and
keeps 1/world of it on each rank: rank r holds [start, end). Its plain split gives every
rank ceil(numel/world) values, wherever that falls. Under a block format (lesson 24) the
vector is cut into blocks of `block` values (32 for MXFP8, 16 for NVFP4), counted from
value 0, each with its own scale, and a rank that casts its shard before the all-gather
computes each block's scale from what it holds: a boundary inside a block gives that
block two scales, neither one device's, and shifts every block after it on that rank.

Write ``block_atomic_bounds(numel, world, block)``: a list of `world` pairs (start, end),
rank 0 first, such that

* every boundary falls between two blocks: each start and end is a multiple of `block`,
  or `numel` itself (the vector's last block, its *tail*, may be shorter than `block`
  when `numel` is not a multiple of it; it is still one block, whole on one rank);
* every value is on exactly one rank: rank 0 starts at 0, each rank starts where the one
  before it ended, and the last ends at `numel` (a rank may hold nothing: start == end);
* no rank holds more than it must: ceil(K/world) blocks at most, K = ceil(numel/block)
  blocks in all. That shard sets the all-gather's buffer and the peak of every rank, so
  a slot larger than needed costs them all (and empties ranks that need not be empty).

ZeRO-3's gather wants equal slots (rank r's at r·S, S values, the last ranks' short or
empty, padded for the collective): S the least whole number of blocks that covers
numel/world is one right answer; a balanced split (no two ranks more than a block apart)
is another, and the grader takes either.

Grade it with `mt.grade("ex24")` in a notebook or `python -m minitp.course.grade ex24`:
in this process, on cases with and without a tail, fewer blocks than ranks and exact
splits, against the rules above. The library has this function
(`mt.fp8.block_shards.shard_bounds`): the grader checks it is not called.
"""


def block_atomic_bounds(numel: int, world: int, block: int) -> list[tuple[int, int]]:
    """Each rank's [start, end) of a flat vector of `numel` values over `world` ranks, every
    boundary between two blocks of `block` values, every value on one rank."""
    # BEGIN SOLUTION
    # hint: ZeRO's share is ceil(numel / world) values: round it UP to whole blocks (a
    # hint: slot S), then rank r's slot starts at r·S; clip both ends at numel, so the last
    # hint: block (the tail) stays whole and the ranks past the end hold nothing.
    share = -(-numel // world)  # ceil: ZeRO's even split
    slot = -(-share // block) * block  # rounded up to whole blocks: the least that covers
    return [(min(r * slot, numel), min((r + 1) * slot, numel)) for r in range(world)]
    # END SOLUTION
