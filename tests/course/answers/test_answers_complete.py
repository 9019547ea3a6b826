"""Every question is checked by one of the answers tests beside this file, or listed in that
file's `NOT_CHECKED` with the reason in its docstring."""

import importlib
from pathlib import Path

from minitp.course.questions import QUESTIONS

HERE = Path(__file__).parent
FILES = sorted(p for p in HERE.glob("test_answers_*.py") if p.name != Path(__file__).name)


def test_every_question_is_checked_or_listed_as_not_checkable():
    source = "".join(p.read_text(encoding="utf-8") for p in FILES)
    not_checked = set().union(*(importlib.import_module(p.stem).NOT_CHECKED for p in FILES))
    unlisted = [k for k in QUESTIONS if k not in not_checked and f'"{k}"' not in source]
    assert not unlisted, unlisted
    assert not_checked <= set(QUESTIONS), not_checked - set(QUESTIONS)  # no stale names
