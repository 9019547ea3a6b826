"""tools/renumber_lessons.py's rewriting rules: every way a lesson's number is written
moves, and nothing else does."""

import importlib.util

from helpers import ROOT

spec = importlib.util.spec_from_file_location("renumber", ROOT / "tools" / "renumber_lessons.py")
renumber = importlib.util.module_from_spec(spec)
spec.loader.exec_module(renumber)

STEMS = {"12_scaling": "13_scaling"}


def test_every_form_of_a_lessons_number_moves():
    text = ("see [12 · Scaling](12_scaling.ipynb) and `12_scaling`; mt.grade(\"ex12\"); "
            "exercises/ex12_tp_step_time.py; def test_ex12_grader(); lesson12.py; "
            "mt.question(\"12.weak-efficiency\"); lesson 12's figure; Lessons 07 and 12; "
            "lessons 10–12; Exercise 12: ...\n# 12 · Scaling\n"
            "def test_lesson_12_explorer(); LESSON_12 = ...\n")
    moved = renumber.rewrite(text, 12, 13, STEMS)
    assert moved == ("see [13 · Scaling](13_scaling.ipynb) and `13_scaling`; mt.grade(\"ex13\"); "
                     "exercises/ex13_tp_step_time.py; def test_ex13_grader(); lesson13.py; "
                     "mt.question(\"13.weak-efficiency\"); lesson 13's figure; Lessons 07 and 13; "
                     "lessons 10–13; Exercise 13: ...\n# 13 · Scaling\n"
                     "def test_lesson_13_explorer(); LESSON_13 = ...\n")


def test_other_numbers_stay():
    text = ("torch 2.12.0, 12 GB, t = 12, 0.12 s, ex120, lesson 11, figures[\"12\"], "
            "v12.x, 12.5 ms, lessons 11 and 13, lesson_120, LESSON_1\n")
    assert renumber.rewrite(text, 12, 13, STEMS) == text


def test_the_tool_never_rewrites_itself_or_this_test():
    """Both hold lesson numbers as examples of what moves (a renumbering once rewrote this
    file's expected strings)."""
    names = {str(p.relative_to(ROOT)) for p in renumber.tracked_files()}
    assert not names & set(renumber.OWN) and "README.md" in names


def test_a_swap_parks_one_lesson_so_that_no_number_moves_twice():
    moves = renumber.swap_moves(9, 10)
    assert moves == [(10, renumber.PARKED), (9, 10), (renumber.PARKED, 9)]
    assert not list((ROOT / "notebooks").glob(f"{renumber.PARKED:02d}_*.ipynb"))  # a free number
