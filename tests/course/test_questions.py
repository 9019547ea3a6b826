"""The question form: the right answer passes, each named wrong answer gets its sentence,
an empty answer is told so without revealing anything, the numbers are the learner's
own (drawn from the seed), and the worked answer comes only after an attempt."""

import pytest

import minitp as mt
from minitp.course.questions import QUESTIONS

SEEDS = ["ada", "grace", "alan", "", "12345"]


@pytest.mark.parametrize("key", sorted(QUESTIONS))
@pytest.mark.parametrize("seed", SEEDS)
def test_the_right_answer_passes_and_is_worked_out(key, seed):
    q = mt.question(key, seed=seed)
    verdict = q.check(q.right(q.params))
    assert verdict.right is True and verdict.revealed, str(verdict)
    assert "Worked answer" in str(verdict)


@pytest.mark.parametrize("key", sorted(QUESTIONS))
@pytest.mark.parametrize("seed", SEEDS)
def test_each_usual_mistake_is_named(key, seed):
    q = mt.question(key, seed=seed)
    assert q.wrong, f"{key} names no usual mistake"
    for mistake in q.wrong:
        verdict = q.check(mistake.value(q.params))
        assert verdict.right is False and verdict.says == mistake.says, (mistake.says, verdict)
        assert verdict.revealed  # after an attempt, the worked answer


@pytest.mark.parametrize("key", sorted(QUESTIONS))
@pytest.mark.parametrize("empty", [None, ...])
def test_an_empty_answer_is_told_so_and_reveals_nothing(key, empty):
    verdict = mt.question(key, seed="ada").check(empty)
    assert verdict.right is None and verdict.revealed is None
    assert "no answer yet" in str(verdict).lower() and "Worked answer" not in str(verdict)
    assert "no answer yet" in verdict._repr_markdown_()


def test_an_answer_of_the_wrong_kind_is_told_so_without_a_crash():
    verdict = mt.question("01.ring-bytes", seed="ada").check("a lot")
    assert verdict.right is False and "not an answer of this kind" in verdict.says
    assert "not one of the usual mistakes" in mt.question("01.ring-bytes").check(1.0).says


def test_the_numbers_are_the_learners_own():
    drawn = {tuple(sorted(mt.question("01.ring-bytes", seed=s).params.items())) for s in SEEDS}
    assert len(drawn) > 1  # other seeds, other numbers
    again = mt.question("01.ring-bytes", seed="ada").params
    assert again == mt.question("01.ring-bytes", seed="ada").params  # the same seed, the same


def test_a_choice_is_read_whatever_its_case_and_an_unknown_key_is_refused():
    assert mt.question("01.which-collective").check(" B ").right is True
    with pytest.raises(ValueError, match="unknown question '09.nothing'"):
        mt.question("09.nothing")


def test_a_formula_is_compared_at_random_points_and_its_errors_are_told():
    q = mt.question("01.ring-bytes-formula", seed="ada")
    assert q.check(lambda n, S: 2 * S * (n - 1) / n).right is True  # any equal form
    assert q.check(lambda n, S: 2 * S).says.startswith("that is the limit")
    assert "not an answer of this kind" in q.check(42).says  # not a function
    raised = q.check(lambda n, S: S / (n - n)).says
    assert "your function raised ZeroDivisionError" in raised
