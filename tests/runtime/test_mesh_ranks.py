"""`mt.Mesh(..., ranks=...)`: a grid over part of the world. The ranks it accepts, and the
one line for those it cannot use (checked before any group is made); the grids themselves
run in tests/serving/test_refit_layouts.py (a trainer on ranks 0–1, a generator on 2–3)."""

import pytest

from minitp.runtime.mesh import _check_ranks


def test_the_whole_world_by_default_and_a_part_when_given():
    assert _check_ranks(None, 4, 3) == (0, 1, 2, 3)
    assert _check_ranks(range(2, 4), 4, 2) == (2, 3)
    assert _check_ranks([0, 3], 4, 3) == (0, 3)


@pytest.mark.parametrize("ranks, me, message", [
    ([3, 2], 2, "distinct ascending ranks in 0..3"),
    ([1, 1], 1, "distinct ascending ranks"),
    (range(3, 5), 3, "distinct ascending ranks in 0..3"),
    ([], 0, "distinct ascending ranks"),
    (range(2, 4), 0, "rank 0 built a Mesh over ranks \\[2, 3\\]: only the ranks a grid spans"),
    (2, 0, "a sequence of global ranks"),
])
def test_ranks_it_cannot_use_are_one_line(ranks, me, message):
    with pytest.raises((TypeError, ValueError), match=message) as error:
        _check_ranks(ranks, 4, me)
    assert "\n" not in str(error.value)
