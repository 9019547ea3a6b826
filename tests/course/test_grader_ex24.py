"""The grader of ex24 (block-atomic shards, lesson 24) names the usual mistakes: each wrong
answer is the reference solution with one mistake built in. That the solution passes is its
lesson's cell; that the untouched exercise fails every check, tests/course/test_exercises.py.

The checks, in order: (a) boundaries between blocks, (b) each value on one rank, (c) the
largest shard the least possible, (d) no shortcut. All in this process, no launch."""

import pytest
from test_exercises import _variant

import minitp as mt

SLOT = "slot = -(-share // block) * block"
BOUNDS = "return [(min(r * slot, numel), min((r + 1) * slot, numel)) for r in range(world)]"
BALANCED = ("    blocks = -(-numel // block)\n"
            "    cuts = [block * (r * (blocks // world) + min(r, blocks % world))\n"
            "            for r in range(world + 1)]\n"
            "    return [(min(a, numel), min(b, numel)) for a, b in zip(cuts, cuts[1:])]\n")

PILED = ("base = max(numel // block // world, 1) * block  # whole blocks each, the rest last\n"
         "    return [(min(r * base, numel), numel if r == world - 1 else min((r + 1) * base, "
         "numel))\n            for r in range(world)]")


def _checks(tmp_path, *edits):
    report = mt.grade("ex24", path=_variant(tmp_path, "ex24", *edits))
    return report.checks


MISTAKES = {  # the mistake built in -> (the check that fails, words its detail must hold)
    "ZeRO's even split": ((SLOT, "slot = share"), 0, "ZeRO's even split"),
    "rounded down": ((SLOT, "slot = share // block * block"), 1,
                     "values [96, 100) are on no rank — the tail"),
    "not clipped": ((BOUNDS, "return [(r * slot, (r + 1) * slot) for r in range(world)]"), 1,
                    "rank 1 ends at 128, past the vector's 100 values"),
    "tail repeated": ((BOUNDS, BOUNDS + "[:-1] + [(block * ((numel - 1) // block), numel)]"),
                      1, "is on ranks"),
    "a slot too large": ((SLOT, "slot = (share // block + 1) * block"), 2,
                         "holds nothing, though 4 blocks can give each of 4 ranks one"),
    "the remainder piled": ((BOUNDS, PILED), 2, "the remainder piled on one rank"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_mistake_is_named_by_the_check_it_breaks(tmp_path, mistake):
    edit, failing, words = MISTAKES[mistake]
    checks = _checks(tmp_path, edit)
    assert [c.passed for c in checks] == [i != failing for i in range(4)], \
        [(c.name, c.detail) for c in checks]
    assert words in checks[failing].detail, checks[failing].detail
    assert checks[failing].hint


def test_a_balanced_split_passes_and_equal_slots_are_said_to_leave_a_rank_empty(tmp_path):
    checks = _checks(tmp_path, (f"    {BOUNDS}\n", BALANCED))
    assert all(c.passed for c in checks), [(c.name, c.detail) for c in checks]
    assert "leaves rank" not in checks[2].detail
    reference = mt.grade("ex24", solutions=True).checks[2]
    assert "numel=100, world=3, block=32 leaves rank 2 empty" in reference.detail


def test_the_librarys_answer_is_refused(tmp_path):
    checks = _checks(tmp_path, (f"    {BOUNDS}\n",
                                "    from minitp.fp8 import block_shards\n"
                                "    return block_shards.shard_bounds(numel, world, block)\n"))
    assert [c.passed for c in checks] == [True, True, True, False]
    assert "shard_bounds" in checks[3].detail
    from minitp.fp8 import block_shards
    assert block_shards.shard_bounds.__name__ == "shard_bounds"  # put back


def test_the_wrong_number_of_shards_is_told_so(tmp_path):
    checks = _checks(tmp_path, ("for r in range(world)]", "for r in range(world - 1)]"))
    assert not any(c.passed for c in checks)
    assert checks[0].detail == "numel=100, world=3, block=32: returned 2 shards, one a rank: 3"
