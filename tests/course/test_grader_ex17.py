"""The grader of ex17 (a plan under a memory cap, and why, lesson 17) says what is wrong, not
only that something is: solution-passes and blank-fails are tests/course/test_exercises.py's.
Each wrong answer here is the reference solution with one habit built in, or a short file
that takes a shortcut; one test per diagnosis the grader names."""

import re

import minitp as mt
from minitp.course import grading
from minitp.course.graders.ex17_cases import CASES

DEPTHS = "def depths(cfg, n_gpus, tp, global_batch):\n    return []\n"


def _variant(tmp_path, *edits):
    """The reference solution with `edits` (old, new) made: a learner's mistake."""
    source = grading.exercise_path("ex17", solutions=True).read_text()
    for old, new in edits:
        assert old in source, f"the solution no longer contains {old!r}: update this test"
        source = source.replace(old, new)
    path = tmp_path / "ex17_variant.py"
    path.write_text(source)
    return path


def _written(tmp_path, body):
    """A learner's file of its own: the exercise's names, and `body`."""
    path = tmp_path / "ex17_written.py"
    path.write_text(DEPTHS + body)
    return path


def _failed(report):
    return {c.name: c for c in report.checks if not c.passed}


def _only(report, word):
    """The one failed check, whose name contains `word`."""
    failed = _failed(report)
    assert len(failed) == 1, str(report)
    (name, check), = failed.items()
    assert word in name, str(report)
    return check


# -- the plan: valid, fits, fast ---------------------------------------------------------

def test_the_obvious_rule_tp_8_is_too_slow_on_h100s_and_says_tp(tmp_path):
    # No rule 4: tp = the node, the shallowest pipeline, as Takeaway #1 alone says.
    report = mt.grade("ex17", path=_variant(tmp_path, ("    if t > 1:\n", "    if False:\n")))
    slow = _only(report, "within 10%")
    assert slow.detail.startswith("GPT 22B on 64 H100s") and "tp=8" in slow.detail
    assert "slower than the best plan that fits" in slow.detail and slow.tensor == "tp"
    assert slow.max_error > 0.1 and "halve tp" in slow.hint


def test_tensor_parallelism_where_one_gpu_holds_the_model_is_too_slow(tmp_path):
    # No rule 1: model parallelism for a model that fits on one GPU.
    report = mt.grade("ex17", path=_variant(tmp_path, ("if by_hand(1, 1, None) > memory_cap:",
                                                       "if True:")))
    slow = _only(report, "within 10%")
    assert slow.detail.startswith("GPT 1.7B on 32 A100s") and slow.tensor == "tp", str(report)


def test_never_recomputing_leaves_gpt3_on_64_gpus_over_the_cap_named_in_gib(tmp_path):
    report = mt.grade("ex17", path=_variant(
        tmp_path, ("for rc in RECOMPUTE for p in options", "for rc in (None,) for p in options"),
        ('(options[-1], "full")', "(options[-1], None)")))
    failed = _failed(report)
    fits = next(c for name, c in failed.items() if "memory cap" in name)
    assert fits.detail.startswith("GPT-3 175B on 64 A100s") and "recompute=None" in fits.detail
    assert "over the 72 GiB cap" in fits.detail and fits.max_error > 0, str(report)
    fast = next(c for name, c in failed.items() if "step time" in name)
    assert fast.detail.startswith("not checked for GPT-3 175B on 64 A100s")


def test_ignoring_zero_is_over_the_cap_and_told_what_zero_1_would_need(tmp_path):
    report = mt.grade("ex17", path=_variant(
        tmp_path, ("per_param = 18 if dp == 1 else 6 + 12 / dp", "per_param = 18"),
        ("zero = int(dp > 1)", "zero = 0"), ("zero_stage=int(dp > 1))", "zero_stage=0)")))
    fits = next(c for name, c in _failed(report).items() if "memory cap" in name)
    assert "with ZeRO-1" in fits.hint and "GiB" in fits.hint, str(report)


def test_a_slow_plan_without_zero_where_every_fast_plan_needs_it_is_told_so(tmp_path):
    path = _written(tmp_path, (
        "from minitp.course import grading\n"
        "reference = grading.load(grading.exercise_path('ex17', solutions=True))\n"
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    plan = reference.choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap)\n"
        "    if cfg.n_layer == 60 and cfg.n_head == 80:  # the 76B: tp across two nodes\n"
        "        plan.update(dp=2, pp=4, tp=16, recompute=None, zero_stage=0)\n"
        "    return plan\n"))
    slow = next(c for name, c in _failed(mt.grade("ex17", path=path)).items()
                if "step time" in name)
    assert slow.detail.startswith("GPT 76B") and "no plan without ZeRO" in slow.hint


def test_an_invalid_split_is_refused_with_the_reason(tmp_path):
    path = _written(tmp_path, (
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    return {'dp': 1, 'pp': 16, 'tp': 8, 'recompute': None, 'zero_stage': 0}\n"))
    report = mt.grade("ex17", path=path)
    assert not any(c.passed for c in report.checks[:5]), str(report)
    assert "world size is 1024" in report.checks[0].detail
    assert report.checks[5].passed  # no shortcut was taken, only a wrong one


# -- reasoned, not searched --------------------------------------------------------------

def test_calling_the_planner_is_refused_however_it_was_imported(tmp_path):
    path = _written(tmp_path, (
        "from minitp.calc import plan\n"
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    c = plan(cfg, cluster, global_batch, n_gpus, micro_batches=(1,),\n"
        "             zero_stage=(0, 1, 2, 3), usable=memory_cap / cluster.memory).best\n"
        "    return {'dp': c.dp, 'pp': c.pp, 'tp': c.tp, 'recompute': c.recompute,\n"
        "            'zero_stage': c.zero_stage}\n"))
    report = mt.grade("ex17", path=path)
    assert [c.passed for c in report.checks] == [True] * 3 + [False] * 3, str(report)
    assert report.checks[5].detail == "your code called calc.plan"
    assert 'the plan has no "why"' in report.checks[3].detail


def test_reading_the_answer_off_the_brute_force_search_is_refused_too(tmp_path):
    path = _written(tmp_path, (
        "from minitp.calc.planning.search import every_configuration\n"
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    c = next(c for c in every_configuration(cfg, cluster, n_gpus, global_batch,\n"
        "                                            memory_cap) if c.fits)\n"
        "    return {'dp': c.dp, 'pp': c.pp, 'tp': c.tp, 'recompute': c.recompute,\n"
        "            'zero_stage': c.zero_stage}\n"))
    report = mt.grade("ex17", path=path)
    assert not report.checks[5].passed, str(report)
    assert "calc.planning.search.every_configuration" in report.checks[5].detail
    import sys
    assert sys.getprofile() is None  # the grader took its hook away


def test_a_search_that_asks_the_calculator_about_every_split_is_named_with_its_count(tmp_path):
    path = _written(tmp_path, (
        "from minitp.calc import memory_per_gpu, step_time\n"
        "def choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap):\n"
        "    best = None\n"
        "    for tp in (1, 2, 4, 8):\n"
        "        for pp in (p for p in range(1, n_gpus // tp + 1) if n_gpus % (tp * p) == 0):\n"
        "            dp = n_gpus // (tp * pp)\n"
        "            if cfg.n_layer % pp or cfg.n_head % tp or global_batch % dp:\n"
        "                continue\n"
        "            for rc in (None, 'selective', 'full'):\n"
        "                z = int(dp > 1)\n"
        "                if memory_per_gpu(cfg, 1, dp, pp, tp, tp > 1, rc, z, 'megatron',\n"
        "                                  microbatches=global_batch // dp)['total'] \\\n"
        "                        > memory_cap:\n"
        "                    continue\n"
        "                s = step_time(cfg, cluster, dp, pp, tp, 1, global_batch, tp > 1, rc,\n"
        "                              zero_stage=z).total\n"
        "                if best is None or s < best[0]:\n"
        "                    best = (s, {'dp': dp, 'pp': pp, 'tp': tp, 'recompute': rc,\n"
        "                                'zero_stage': z})\n"
        "    return best[1]\n"))
    report = mt.grade("ex17", path=path)
    searched = report.checks[5]
    assert not searched.passed and searched.tensor == "calls", str(report)
    assert "calc.memory_per_gpu" in searched.detail and "calc.step_time" in searched.detail
    assert "where 3 are allowed: that is a search" in searched.detail
    assert all(c.passed for c in report.checks[:3])  # a good plan: only the search is wrong


# -- why: the memory of the plan and of the shallower pipeline ---------------------------

def _memory_check(tmp_path, *edits):
    return _only(mt.grade("ex17", path=_variant(tmp_path, *edits)), "memory and the shallower")


def test_memory_in_gb_is_named(tmp_path):
    why = _memory_check(tmp_path, ('return memory["total"] / GiB', 'return memory["total"] / 1e9'))
    assert why.tensor == "memory_gib" and "in GB (10^9 bytes), not GiB" in why.detail


def test_memory_in_bytes_is_named(tmp_path):
    why = _memory_check(tmp_path, ('return memory["total"] / GiB', 'return memory["total"]'))
    assert "in bytes, not GiB" in why.detail


def test_memory_without_the_activations_is_named(tmp_path):
    why = _memory_check(tmp_path, ('return memory["total"] / GiB',
                                   'return (memory["total"] - memory["activations"]) / GiB'))
    assert "the model states alone, without the activations" in why.detail


def test_memory_of_the_activations_alone_is_named(tmp_path):
    why = _memory_check(tmp_path, ('return memory["total"] / GiB',
                                   'return memory["activations"] / GiB'))
    assert "the activations alone" in why.detail


def test_memory_without_the_plans_zero_stage_is_named(tmp_path):
    why = _memory_check(tmp_path, ('recompute, zero, "megatron"', 'recompute, 0, "megatron"'))
    assert why.detail.startswith("GPT-3 175B on 1024") and "without ZeRO-1" in why.detail


def test_no_shallower_memory_where_a_shallower_depth_exists_is_named(tmp_path):
    why = _memory_check(tmp_path, ("gib(shallower[-1]) if shallower else None", "None"))
    assert why.tensor == "shallower_gib" and "pp=2, the next valid depth below" in why.detail
    assert "over the 72 GiB cap" in why.detail


def test_a_shallower_memory_where_pp_is_already_shallowest_is_named(tmp_path):
    why = _memory_check(tmp_path, ("gib(shallower[-1]) if shallower else None",
                                   "gib(shallower[-1]) if shallower else 1.0"))
    assert why.detail.startswith("GPT 1.7B") and "expected None" in why.detail


def test_the_deeper_pipeline_for_the_shallower_one_is_named(tmp_path):
    why = _memory_check(tmp_path, ("if q < p]", "if q > p][:1]"))
    assert "the deeper pipeline pp=8, not the shallower pp=2" in why.detail, why.detail


def test_the_shallower_pipeline_with_another_zero_stage_is_named(tmp_path):
    why = _memory_check(tmp_path, ("def gib(pp):", "def gib(pp, zero=zero):"),
                        ("gib(shallower[-1]) if", "gib(shallower[-1], 0) if"))
    assert "pp=2 with recompute=None and ZeRO-0; keep the plan's" in why.detail, why.detail


def test_a_why_without_a_key_is_named(tmp_path):
    report = mt.grade("ex17", path=_variant(tmp_path, ('"tp_stop": stop, "bubble"',
                                                       '"tp_stop": stop, "bubbles"')))
    failed = _failed(report)
    assert len(failed) == 2 and all('"why" lacks bubble' in c.detail for c in failed.values())


# -- why: where tp stops, and the bubble -------------------------------------------------

def _stop_check(tmp_path, *edits):
    return _only(mt.grade("ex17", path=_variant(tmp_path, *edits)), "where tp stops")


def test_tp_stop_always_node_is_told_the_real_reason(tmp_path):
    why = _stop_check(tmp_path, ('"tp_stop": stop', '"tp_stop": "node"'))
    assert why.detail.startswith("GPT 22B on 64 H100s") and why.tensor == "tp_stop"
    assert "it is 'cost': 8 GPUs fit in a node of 8 and divide the 64 heads" in why.detail


def test_tp_stop_outside_the_three_reasons_is_told_them(tmp_path):
    why = _stop_check(tmp_path, ('"tp_stop": stop', '"tp_stop": "memory"'))
    assert "(one of 'node', 'heads', 'cost')" in why.detail


def test_tp_stop_heads_is_checked_where_the_heads_stop_tp(tmp_path):
    why = _stop_check(tmp_path, ('else "heads" if cfg.n_head % (2 * t) else "cost"',
                                 'else "cost"'))
    assert why.detail.startswith("GPT 43B (60 heads)") and "60 heads do not divide by 8" \
        in why.detail


def test_the_bubble_as_a_share_of_the_step_is_named(tmp_path):
    why = _stop_check(tmp_path, ("calc.bubble(p, global_batch // dp)",
                                 "(p - 1) / (global_batch // dp + p - 1)"))
    assert why.tensor == "bubble" and "the bubble's share of the whole step" in why.detail


def test_the_bubble_with_m_the_whole_batch_is_named(tmp_path):
    why = _stop_check(tmp_path, ("calc.bubble(p, global_batch // dp)", "(p - 1) / global_batch"))
    assert "m taken as the global batch 1536; each replica runs m = 1536/32 = 48" in why.detail


def test_the_bubble_as_p_over_m_is_named(tmp_path):
    why = _stop_check(tmp_path, ("calc.bubble(p, global_batch // dp)", "p / (global_batch // dp)"))
    assert "p/m: the bubble is (p - 1)/m" in why.detail


def test_the_exercise_counts_the_runs_the_grader_asks_about():
    words = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
    said = re.search(r"for (\w+) runs", grading.exercise_path("ex17").read_text()).group(1)
    assert words[said] == len(CASES), f"the exercise says {said} runs, the grader has {len(CASES)}"
