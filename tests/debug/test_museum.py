"""`mt.debug.museum`: every bug reproduces (departs from one device on real ranks, or
hangs into a CollectiveTimeout that names the rank that left) and its fix is exact.

CI time: every drifting bug and every fix run in ONE launch of 4 ranks (each rank runs
the spoiled settings, then every fix, the hang's too); the hang, spoiled, gets its own
launch with a 2 s timeout.
"""

from __future__ import annotations

import re

import pytest

import minitp as mt
from minitp.debug import museum

DEPARTS = 1e-4  # every bug lands at least this far from one device (the least: 2.4e-4)
EXACT = 1e-12  # a fix: float64's rounding of a few sums (Newton–Schulz's: 3e-15); a step
# bug's fix is compared module by module at this tolerance (museum.catalog.TOLERANCE)


def _spoiled_and_fixed(drifts):
    return {False: museum.on_rank(drifts, False), True: museum.on_rank(list(museum.MUSEUM), True)}


@pytest.fixture(scope="module")
def ran():
    drifts = [b.key for b in museum.BUGS if b.looks == "drift"]
    run = mt.launch(_spoiled_and_fixed, museum.WORLD, drifts, timeout=300)
    return {key: ([r[False].get(key) for r in run], [r[True][key] for r in run])
            for key in museum.MUSEUM}


def test_the_museum_holds_at_least_fifteen_cited_bugs():
    assert len(museum.MUSEUM) >= 15
    for bug in museum.BUGS:
        assert bug.looks in ("drift", "hang"), bug.key
        assert re.search(r"#\d+", bug.citation) or "Playbook" in bug.citation, bug.key
        assert bug.symptom and bug.setting and bug.fix, bug.key


@pytest.mark.parametrize("key", [b.key for b in museum.BUGS if b.looks == "drift"])
def test_each_drifting_bug_departs_and_its_fix_is_exact(ran, key):
    spoiled, fixed = ran[key]
    assert max(r["departure"] for r in spoiled) > DEPARTS, (key, spoiled)
    assert max(r["departure"] for r in fixed) < EXACT, (key, fixed)
    if "first" in spoiled[0]:  # a step bug: a module is named, and nothing in its fix
        assert museum.earliest(spoiled) is not None and museum.earliest(fixed) is None
        assert min(r["compared"] for r in fixed) > 10, key  # and the fix did compare


def test_the_hang_times_out_naming_the_rank_that_left_and_its_fix_completes(ran):
    visit = museum.reproduce("uneven_steps_hang", hang_timeout=2.0)["uneven_steps_hang"]
    assert visit.hung and "ranks [3]: had already returned" in visit.report, visit.report
    assert "waiting in all_reduce" in visit.report
    assert [r["departure"] for r in ran["uneven_steps_hang"][1]] == [0.0] * museum.WORLD


def test_a_name_draws_the_same_bug_and_bad_input_is_refused_in_one_line():
    assert museum.draw("Ada Lovelace") == museum.draw(" Ada Lovelace ")
    assert museum.draw("Ada Lovelace") in museum.MUSEUM
    assert len({museum.draw(f"learner {i}") for i in range(64)}) > len(museum.BUGS) // 2
    for call, match in ((lambda: museum.draw(""), "your name"),
                        (lambda: museum.reproduce("no_such_bug"), "not in the museum")):
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)
