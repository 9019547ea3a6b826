"""The grader of ex12 (ZB-H1's order for one stage, lesson 12) names the usual mistakes:
every wrong answer here is the reference solution with one mistake built in, and each
diagnosis the grader can give has a test. That the solution passes every check and the
untouched exercise fails every one is tests/course/test_exercises.py's (parametrized over
every exercise, ex12 included); here the blank's message is checked word for word.

The checks, in order: 0 the dependencies on paper (every unit once, each W after its B,
the pipeline runs to its end), 1 at most p microbatches in flight, 2 the bubble with unit
costs (p − 1 ticks), 3 train_step on real ranks, 4 no call to `zb_h1`.

Budget: the real ranks are left out (`STEP_CHECK`) except once, for an order that is
valid and exact but slow; every other grade runs in this process in well under a second.
"""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp.course.graders import ex12
from minitp.pipeline import schedules
from minitp.pipeline.on_paper import simulate

WARMUP = "warmup = min(p - r - 1, m)"
DELAY = 'if kind == "B" and i >= r:'
APPEND = '''        order.append((kind, chunk, i))
        if kind == "B" and i >= r:  # the first r B's go without their W
            order.append(("W", 0, next_w))'''
OWED = "range(next_w, m)]"
REFUSED = "not checked: the order is not a pipeline order yet (see above)"


@pytest.fixture
def on_paper(monkeypatch):
    """The paper checks alone: no real ranks."""
    monkeypatch.setattr(ex12, "STEP_CHECK", False)


def _grade(tmp_path, *edits):
    return mt.grade("ex12", path=_variant(tmp_path, "ex12", *edits)).checks


def _refused(checks):
    """The order is no pipeline order: the first check says why, the next three refuse."""
    assert not checks[0].passed, checks
    assert [c.detail for c in checks[1:4]] == [REFUSED] * 3, checks
    assert checks[4].passed, checks
    return checks[0]


def test_the_blank_says_what_is_not_written_and_gives_its_hint():
    checks = mt.grade("ex12").checks
    assert not any(c.passed for c in checks), checks
    assert checks[0].detail == "zb_h1_order is not written yet"
    assert checks[0].hint.startswith("Which of 1F1B's units must stay where they are")
    assert all(c.detail == "not checked: zb_h1_order is not written yet" for c in checks[1:])


def test_the_solution_is_zb_h1_and_its_numbers_are_the_checks():
    """The reference the checks' numbers come from: the solution's order is zb_h1's, its
    peak p and its idle p − 1 on every rank, for every m ≥ p the checks try."""
    module = mt.course.grading.load(mt.course.grading.exercise_path("ex12", solutions=True))
    for p, m in ex12.CASES:
        orders = [module.zb_h1_order(p, r, m) for r in range(p)]
        assert orders == [schedules.zb_h1(p, r, m) for r in range(p)]
        played = simulate("zb-h1", p, m, costs=ex12.UNIT_COSTS)
        assert max(played["peak"]) <= p
        if m >= p:
            assert played["idle"] == [p - 1] * p


def test_a_w_before_its_b(tmp_path, on_paper):
    first = _refused(_grade(tmp_path, (APPEND, '''        if kind == "B" and i >= r:
            order.append(("W", 0, next_w))
        order.append((kind, chunk, i))
        if False:''')))
    assert first.detail == ("p=2, m=2, stage 0: W0 comes before B0: a weight pass needs the "
                            "gradient its B computed")
    assert first.rank == 0 and first.hint == "append each W after its own B"


def test_w_not_delayed_is_exact_but_idles_2_p_minus_1(tmp_path):
    # A valid order, each W right after its B: the real ranks train exactly, the bound
    # holds (1F1B's p − r), but the bubble is (p − 1)(F + B), not (p − 1)(F + B − W).
    checks = _grade(tmp_path, (DELAY, 'if kind == "B":'))
    assert [c.passed for c in checks] == [True, True, False, True, True], checks
    assert checks[1].detail.endswith("the stages' peaks are [4, 3, 2, 1]")
    assert checks[2].detail == (
        "p=4, m=4: every rank idles 6 ticks = 2(p − 1) = (p − 1)(F + B), where ZB-H1 idles "
        "p − 1 = 3: W not delayed: on stage 1 each W runs right after its B, so the B's "
        "reach the first stage later and no W is left for the drain")
    assert checks[2].rank == 1 and "delayed by r microbatches" in checks[2].hint
    assert checks[3].max_error < ex12.TOLERANCE


def test_all_w_at_the_end_holds_every_microbatch(tmp_path, on_paper):
    checks = _grade(tmp_path, (DELAY, "if False:"))
    assert [c.passed for c in checks[:3]] == [True, False, False], checks
    assert checks[1].detail == (
        "p=4, m=6: stage 0 holds 6 microbatches at once, more than p = 4: all W at the end: "
        "each microbatch is held from its F until its W, so stage 0 holds all m = 6")
    assert checks[2].detail == (
        "p=4, m=4: every rank idles 6 ticks = 2(p − 1) = (p − 1)(F + B), where ZB-H1 idles "
        "p − 1 = 3: all W at the end: they wait behind the last B and cannot fill the gaps "
        "while stage 0 waits for the gradients coming back")


def test_one_forward_too_many_before_the_first_b(tmp_path, on_paper):
    # A warm-up of p − r forwards: no deadlock, one microbatch more held on every stage,
    # and at m = p a longer bubble.
    checks = _grade(tmp_path, (WARMUP, "warmup = min(p - r, m)"))
    assert [c.passed for c in checks[:3]] == [True, False, False], checks
    assert checks[1].detail == (
        "p=4, m=6: stage 0 holds 5 microbatches at once, more than p = 4: stage 0 runs 5 "
        "forwards before its first B, where 1F1B runs p − r = 4 (a warm-up of p − r − 1, "
        "then one forward and one backward): each extra one is one more microbatch held")
    assert checks[2].detail == (
        "p=4, m=4: every rank idles 4 ticks, where ZB-H1 idles p − 1 = 3: stage 1 runs 4 "
        "forwards before its first B, where 1F1B runs p − r = 3 (a warm-up of p − r − 1, "
        "then one forward and one backward)")


def test_a_warmup_of_r_forwards_deadlocks(tmp_path, on_paper):
    # r for p − r − 1: stage 0 runs B0 before sending the activations stage 1 needs first
    # (a B placed before the next stage's B can arrive). Named, not a hang.
    first = _refused(_grade(tmp_path, (WARMUP, "warmup = min(r, m)")))
    assert first.detail == (
        "p=2, m=2: deadlock: stage 0 waits at B0 for microbatch 0's gradient from stage 1; "
        "stage 1 waits at F1 for microbatch 1's activation, which stage 0 sends only after "
        "B0: stage 0's B0 comes before the next stage's B0 can arrive")
    assert first.rank == 0 and "p − r − 1 forwards" in first.hint


def test_one_stage_alone_with_a_b_too_early_deadlocks(tmp_path, on_paper):
    # Only stage 0 is wrong (one forward before its first B's turn instead of p − 1): at
    # p = 3 it merely waits; at p = 4 stage 1 needs F2 before it can send B0 back.
    first = _refused(_grade(tmp_path, (WARMUP, "warmup = min(p - r - 1 if r else 1, m)")))
    assert first.detail == (
        "p=4, m=4: deadlock: stage 0 waits at B0 for microbatch 0's gradient from stage 1; "
        "stage 1 waits at F2 for microbatch 2's activation, which stage 0 sends only after "
        "B0: stage 0's B0 comes before the next stage's B0 can arrive")


def test_the_deadlock_finder_agrees_with_simulate():
    """The grader's own play-through deadlocks exactly where `simulate` does."""
    def reversed_warmup(p, r, m, v=1):
        order = schedules.one_f_one_b(p, p - 1 - r, m)
        return [unit for kind, k, i in order
                for unit in ([(kind, k, i)] + ([("W", k, i)] if kind == "B" else []))]

    for make in (schedules.zb_h1, schedules.zb_h2, reversed_warmup):
        for p, m in ex12.CASES:
            orders = [make(p, r, m) for r in range(p)]
            try:
                simulate(make, p, m)
                deadlocks = False
            except RuntimeError:
                deadlocks = True
            assert (ex12._deadlock(orders, p) is not None) == deadlocks, (make, p, m)


def test_a_unit_missing(tmp_path, on_paper):
    first = _refused(_grade(tmp_path, (OWED, "range(next_w, m - 1)]")))
    assert first.detail == "p=2, m=2, stage 1: W1 missing"
    assert first.hint == "every microbatch's F, B and W, once each"


def test_a_unit_repeated(tmp_path, on_paper):
    first = _refused(_grade(tmp_path, (OWED, "range(next_w - 1, m)]")))
    assert first.detail == "p=2, m=2, stage 0: W1 runs twice"


def test_the_last_w_not_the_last_microbatchs(tmp_path, on_paper):
    first = _refused(_grade(tmp_path, (OWED, "reversed(range(next_w, m))]")))
    assert first.detail == (
        "p=3, m=3, stage 2: the last B or W is microbatch 1's, not 2's (the data-parallel "
        "gradient sync starts with the last microbatch's)")


def test_w_delayed_one_microbatch_too_many(tmp_path, on_paper):
    checks = _grade(tmp_path, ("i >= r:", "i >= r + 1:"))
    assert [c.passed for c in checks[:3]] == [True, False, False], checks
    assert checks[1].detail == (
        "p=4, m=6: stage 0 holds 5 microbatches at once, more than p = 4: stage 0's first W "
        "comes after 2 B's: its W's are delayed by 1 microbatch, where ZB-H1 delays stage "
        "r's by r = 0")


def test_calling_one_f_one_b_is_allowed_calling_zb_h1_is_not(tmp_path, on_paper):
    allowed = _grade(tmp_path, ("    f_and_b = [(\"F\", 0, i) for i in range(warmup)]",
                                "    f_and_b = __import__('minitp').pipeline.schedules"
                                ".one_f_one_b(p, r, m)"),
                     ("    for i in range(m - warmup):\n", "    for i in range(0):\n"),
                     ("    f_and_b += [(\"B\", 0, i) for i in range(m - warmup, m)]\n", ""))
    assert [c.passed for c in allowed] == [True, True, True, False, True], allowed
    borrowed = _grade(tmp_path, (WARMUP, "return __import__('minitp').pipeline.schedules"
                                         ".zb_h1(p, r, m)\n    " + WARMUP))
    assert [c.passed for c in borrowed] == [True, True, True, False, False], borrowed
    assert borrowed[4].detail == "your code called minitp.pipeline.schedules.zb_h1"


def test_a_malformed_answer_is_a_polite_failure(tmp_path, on_paper):
    checks = _grade(tmp_path, ("    return order\n", "    return [(k, i) for k, _, i in order]\n"))
    assert not any(c.passed for c in checks), checks
    assert checks[0].detail == (
        "zb_h1_order(2, 0, 2): raised ValueError: ('F', 0) is no unit: write (kind, 0, "
        "microbatch), kind \"F\", \"B\" or \"W\"")
    assert all(c.detail == "not checked: the call above failed" for c in checks[1:])


def test_an_unnamed_mistake_gets_questions_not_the_order(tmp_path, on_paper):
    # Stage r's first W in its place, every later one at the end: no usual mistake's shape,
    # so the hints ask where the W's may go rather than say it.
    checks = _grade(tmp_path, (DELAY, 'if kind == "B" and i == r:'))
    assert [c.passed for c in checks[:3]] == [True, False, False], checks
    assert checks[1].hint == ex12.BOUND_ASK and checks[2].hint == ex12.BUBBLE_ASK, checks
    for hint in (checks[1].hint, checks[2].hint):
        assert hint.endswith("?") and "oldest W" not in hint and "by r" not in hint


def test_the_exercise_text_gives_no_order_away():
    text = mt.course.grading.exercise_path("ex12").read_text()
    for order in ("first r B's", "oldest W", "delay stage r's W", "delayed by r"):
        assert order not in text, order
