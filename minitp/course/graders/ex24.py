"""Checks for ex24: block-atomic shard boundaries for a ZeRO-3 unit under MXFP8 or NVFP4.

The learner's `block_atomic_bounds(numel, world, block)` on cases with a tail (a last block
shorter than `block`), without one, with fewer blocks than ranks, and the lesson's weight
(256 × 64 over 3 ranks), judged against the rules, not against one answer (equal slots and
a balanced split both pass):

* (a) every boundary between two blocks: each start and end a multiple of `block`, or
  `numel`. Named: ZeRO's even split, ceil(numel/world), not rounded to whole blocks;
* (b) every value on exactly one rank, in rank order, the tail included. Named: the tail
  dropped (a share rounded down, or K = numel // block), values repeated on two ranks, an
  end past `numel` (the last slot not clipped), the wrong number of ranks;
* (c) no rank holds more than ceil(K/world) blocks. Named: a slot larger than needed
  (it empties ranks that need not be empty), the remainder piled on one rank. Passed with
  a rank left empty where a balanced split would fill it: said, with why it is right;
* (d) built by hand: `fp8.block_shards.shard_bounds` is not called.

No process is launched: the rules are arithmetic.
"""

from __future__ import annotations

from ...fp8 import block_shards
from ...rules import ceil_div
from .base import Check, Stopped, attempt, no_shortcut

# (numel, world, block): a tail of 4; the lesson's weight; one block a rank; exact; a tail
# of 8; fewer blocks than ranks; 5 blocks on 4 ranks; less than a block; 7 NVFP4 blocks and
# a tail on 3 ranks
CASES = ((100, 3, 32), (16384, 3, 32), (128, 4, 32), (16384, 4, 32), (1000, 4, 16),
         (40, 4, 32), (160, 4, 32), (7, 2, 16), (117, 3, 16))
NAMES = ["(a) every boundary between two blocks (a multiple of block, or numel)",
         "(b) every value on exactly one rank, in rank order, the tail included",
         "(c) no rank holds more than ceil(K/world) blocks (K: the vector's blocks)",
         "(d) built by hand: fp8.block_shards.shard_bounds not called"]
HINT = ("the slot: ceil(numel / world) rounded UP to a multiple of block; rank r's at r·slot, "
        "both ends clipped at numel")


def _label(numel, world, block):
    return f"numel={numel}, world={world}, block={block}"


def _shape(bounds, numel, world, block):
    """Why `bounds` is not a list of `world` (start, end) integer pairs, or None."""
    if not isinstance(bounds, (list, tuple)) or len(bounds) != world:
        got = len(bounds) if isinstance(bounds, (list, tuple)) else type(bounds).__name__
        return f"{_label(numel, world, block)}: returned {got} shards, one a rank: {world}"
    for rank, pair in enumerate(bounds):
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
            return f"{_label(numel, world, block)}: rank {rank}'s shard is {pair!r}, not " \
                "(start, end) integers"
    return None


def _judge_a(answers) -> Check:
    for (numel, world, block), bounds in answers:
        for rank, (start, end) in enumerate(bounds):
            for what, at in (("starts", start), ("ends", end)):
                if at % block == 0 or at == numel or not 0 < at < numel:
                    continue
                first = block * (at // block)
                zero = " — ZeRO's even split, ceil(numel/world), not rounded to whole " \
                    "blocks" if at in (rank * ceil_div(numel, world),
                                       (rank + 1) * ceil_div(numel, world)) else ""
                return Check(NAMES[0], False, f"{_label(numel, world, block)}: rank {rank} "
                             f"{what} at {at}, {at - first} values into the block "
                             f"[{first}, {min(first + block, numel)}): its two sides would "
                             f"each take a scale of their own{zero}", rank=rank, hint=HINT)
    return Check(NAMES[0], True, f"{len(answers)} cases, every boundary between two blocks")


def _judge_b(answers) -> Check:
    for (numel, world, block), bounds in answers:
        label = _label(numel, world, block)
        for rank, (start, end) in enumerate(bounds):
            if end > numel:
                return Check(NAMES[1], False, f"{label}: rank {rank} ends at {end}, past the "
                             f"vector's {numel} values: clip the last slot at numel (the "
                             f"tail block is {numel - block * (ceil_div(numel, block) - 1)} "
                             "values long)", rank=rank, hint=HINT)
            if start > end or start < 0:
                return Check(NAMES[1], False, f"{label}: rank {rank}'s shard [{start}, {end}) "
                             "runs backwards", rank=rank, hint=HINT)
        held = [0] * numel
        for start, end in bounds:
            for i in range(start, end):
                held[i] += 1
        if 0 in held:
            lo = held.index(0)
            hi = next((i for i in range(lo, numel) if held[i]), numel)
            tail = (" — the tail: a last block shorter than the others is still a block, "
                    "and rounding down (a share, or K = numel // block) drops it"
                    if hi == numel else "")
            return Check(NAMES[1], False, f"{label}: values [{lo}, {hi}) are on no rank"
                         f"{tail}", hint=HINT)
        if max(held) > 1:
            lo = next(i for i, h in enumerate(held) if h > 1)
            ranks = [r for r, (s, e) in enumerate(bounds) if s <= lo < e]
            return Check(NAMES[1], False, f"{label}: value {lo} is on ranks "
                         f"{', '.join(map(str, ranks))}: each value on one rank", hint=HINT)
        order = [start for start, end in bounds if end > start]
        if order != sorted(order):
            return Check(NAMES[1], False, f"{label}: the shards are not in rank order: "
                         "rank r's values come before rank r+1's (the all-gather "
                         "concatenates them so)", hint=HINT)
    return Check(NAMES[1], True, f"{len(answers)} cases, each value on one rank")


def _judge_c(answers) -> Check:
    emptied = []
    for (numel, world, block), bounds in answers:
        blocks = ceil_div(numel, block)
        most = ceil_div(blocks, world)
        sizes = [ceil_div(end - start, block) for start, end in bounds]
        if max(sizes) > most:
            rank = sizes.index(max(sizes))
            empty = [r for r, s in enumerate(sizes) if s == 0]
            why = (f"; rank {empty[0]} holds nothing, though {blocks} blocks can give each "
                   f"of {world} ranks one: a slot larger than needed"
                   if empty and blocks >= world else
                   " — the remainder piled on one rank" if rank == world - 1 else "")
            return Check(NAMES[2], False, f"{_label(numel, world, block)}: rank {rank} holds "
                         f"{max(sizes)} blocks where {most} suffice ({blocks} blocks over "
                         f"{world} ranks){why}: the largest shard sets the all-gather's "
                         "buffer and every rank's peak", rank=rank, hint=HINT)
        if blocks >= world and 0 in sizes:
            emptied.append(f"{_label(numel, world, block)} leaves rank {sizes.index(0)} empty")
    said = f"{len(answers)} cases, the largest shard the least possible"
    if emptied:
        said += (f"; {'; '.join(emptied)}: equal slots, as fp8.block_shards.shard_bounds "
                 "and FSDP's flat parameter (torch.chunk, its last ranks padded or empty: "
                 "torch/distributed/fsdp/_flat_param.py) — a balanced split would give it a "
                 "block, with the same largest shard")
    return Check(NAMES[2], True, said)


def run(module) -> list[Check]:
    calls = []
    original = block_shards.shard_bounds

    def watched(*args, **kwargs):
        calls.append("fp8.block_shards.shard_bounds")
        return original(*args, **kwargs)

    swapped = [vars(block_shards)] + [vars(module)] * any(
        v is original for v in vars(module).values())
    for namespace in swapped:
        for key in [k for k, v in namespace.items() if v is original]:
            namespace[key] = watched
    try:
        answers = [(case, attempt(module.block_atomic_bounds, *case, names=NAMES,
                                  blank="block_atomic_bounds", label=_label(*case), hint=HINT))
                   for case in CASES]
    except Stopped as stopped:
        return stopped.checks
    finally:
        for namespace in swapped:
            for key in [k for k, v in namespace.items() if v is watched]:
                namespace[key] = original
    for case, bounds in answers:
        wrong = _shape(bounds, *case)
        if wrong:
            return [Check(NAMES[0], False, wrong, hint="return a list of (start, end) pairs, "
                          "rank 0 first")] + [Check(n, False, "not checked: see (a)")
                                              for n in NAMES[1:]]
    return [_judge_a(answers), _judge_b(answers), _judge_c(answers),
            no_shortcut(NAMES[3], calls, "write the rounding yourself: it is three lines")]
