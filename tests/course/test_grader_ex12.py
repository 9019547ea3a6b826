"""The grader of ex12 (a plan under a memory cap, lesson 12) says what is wrong, not only
that something is: solution-passes and blank-fails are tests/course/test_exercises.py's. Each
wrong answer here is the reference solution with one habit built in."""


import minitp as mt
from minitp.course import grading


def _variant(tmp_path, *edits):
    """The reference solution with `edits` (old, new) made: a learner's mistake."""
    source = grading.exercise_path("ex12", solutions=True).read_text()
    for old, new in edits:
        assert old in source, f"the solution no longer contains {old!r}: update this test"
        source = source.replace(old, new)
    path = tmp_path / "ex12_variant.py"
    path.write_text(source)
    return path


def _failed(report):
    return {c.name: c for c in report.checks if not c.passed}


def test_always_tp_1_is_too_slow_for_gpt3_and_says_where_the_time_goes(tmp_path):
    report = mt.grade("ex12", path=_variant(tmp_path, ("product(sizes, sizes,",
                                                       "product([1], sizes,")))
    failed = _failed(report)
    assert len(failed) == 1, str(report)
    (slow,) = failed.values()
    assert "within 10%" in slow.name and slow.detail.startswith("GPT-3 175B on 1024 A100s")
    assert "tp=1" in slow.detail and "slower than the best plan that fits" in slow.detail
    assert f"the most of it is {slow.tensor}" in slow.detail and slow.max_error > 0.5
    assert slow.hint


def test_never_recomputing_picks_tp_across_nodes_on_64_gpus(tmp_path):
    report = mt.grade("ex12", path=_variant(tmp_path, ('(None, "selective", "full")',
                                                       "(None,)")))
    (slow,) = _failed(report).values()
    assert slow.detail.startswith("GPT-3 175B on 64 A100s") and "recompute=None" in slow.detail
    assert slow.tensor == "tp" and "tp=16" in slow.detail, str(report)


def test_ignoring_zero_is_too_slow_where_only_zero_fits_fast(tmp_path):
    report = mt.grade("ex12", path=_variant(tmp_path, ("range(4) if dp > 1 else (0,)",
                                                       "(0,)")))
    (slow,) = _failed(report).values()
    assert slow.detail.startswith("GPT 76B on 128 A100s") and "ZeRO" in slow.hint, str(report)


def test_a_plan_over_the_cap_is_named_with_its_gib(tmp_path):
    report = mt.grade("ex12", path=_variant(tmp_path, ('if memory["total"] > memory_cap:',
                                                       "if False:")))
    failed = _failed(report)
    fits = next(c for name, c in failed.items() if "memory cap" in name)
    assert "over the 72 GiB cap" in fits.detail and fits.max_error > 0, str(report)
    fast = next(c for name, c in failed.items() if "step time" in name)
    assert fast.detail.startswith("not checked for")


def test_an_invalid_split_is_refused_with_the_reason(tmp_path):
    wrong = tmp_path / "ex12_wrong.py"
    wrong.write_text(
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    return {'dp': 1, 'pp': 16, 'tp': 8, 'recompute': None, 'zero_stage': 0}\n"
    )
    report = mt.grade("ex12", path=wrong)
    assert not any(c.passed for c in report.checks[:3]), str(report)
    assert "world size is 1024" in report.checks[0].detail
    assert report.checks[3].passed  # no shortcut was taken, only a wrong one


def test_calling_the_planner_is_refused_however_it_was_imported(tmp_path):
    wrong = tmp_path / "ex12_shortcut.py"
    wrong.write_text(
        "from minitp.calc import plan\n"
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    c = plan(cfg, cluster, global_batch, n_gpus, micro_batches=(1,),\n"
        "             zero_stage=(0, 1, 2, 3), usable=memory_cap / cluster.memory).best\n"
        "    return {'dp': c.dp, 'pp': c.pp, 'tp': c.tp, 'recompute': c.recompute,\n"
        "            'zero_stage': c.zero_stage}\n"
    )
    report = mt.grade("ex12", path=wrong)
    assert [c.passed for c in report.checks] == [True, True, True, False], str(report)
    assert "calc.plan" in report.checks[3].detail


def test_reading_the_answer_off_the_brute_force_search_is_refused_too(tmp_path):
    wrong = tmp_path / "ex12_search.py"
    wrong.write_text(
        "from minitp.calc.search import every_configuration\n"
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    c = next(c for c in every_configuration(cfg, cluster, n_gpus, global_batch,\n"
        "                                            memory_cap) if c.fits)\n"
        "    return {'dp': c.dp, 'pp': c.pp, 'tp': c.tp, 'recompute': c.recompute,\n"
        "            'zero_stage': c.zero_stage}\n"
    )
    report = mt.grade("ex12", path=wrong)
    assert not report.checks[3].passed, str(report)
    assert "calc.search.every_configuration" in report.checks[3].detail
    # and the search still works afterwards: the grader put the class back
    from minitp.calc import search
    assert search.Configuration.__name__ == "Configuration"
