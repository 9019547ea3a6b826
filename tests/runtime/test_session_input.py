"""What `mt.session` and `%ranks` refuse, in one line each, before any process starts."""

from __future__ import annotations

import pytest

from minitp.runtime.session import parse_mesh

pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402

from minitp.runtime.ranks_magic import parse_ranks, parse_start  # noqa: E402


def test_a_mesh_is_read_from_a_string_or_a_dict_and_must_hold_the_ranks():
    assert parse_mesh("dp=2, tp=2", 4) == {"dp": 2, "tp": 2}
    assert parse_mesh({"tp": 4}, 4) == {"tp": 4}
    assert parse_mesh(None, 3) == {}
    with pytest.raises(ValueError, match="holds 2 ranks, the session 4"):
        parse_mesh("dp=2", 4)
    with pytest.raises(ValueError, match="axes are dp, pp, tp, cp, ep"):
        parse_mesh("xp=4", 4)
    with pytest.raises(ValueError, match="axis=size pairs"):
        parse_mesh("dp:4", 4)


def test_the_magic_reads_its_options_and_refuses_the_rest():
    assert parse_start(["4", "--mesh", "dp=2,tp=2", "--timeout=5"]) == (
        4, {"mesh": "dp=2,tp=2", "timeout": 5.0})
    for words in ([], ["0"], ["four"], ["4", "--ports", "3"], ["4", "--mesh"]):
        with pytest.raises(UsageError):
            parse_start(words)
    assert parse_ranks("0,2") == [0, 2] and parse_ranks("  ") is None
    with pytest.raises(UsageError):
        parse_ranks("0-2")
