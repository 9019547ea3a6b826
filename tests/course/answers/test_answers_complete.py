"""Every question is recomputed over the 50 seeds by one of the answers tests beside this file
(its key passed to `asked`, which draws every seed), or listed in that file's `NOT_CHECKED`
with the reason in its docstring. A key only mentioned (a comment, one `mt.question` call)
does not count."""

import importlib
from pathlib import Path

from minitp.course.questions import QUESTIONS

HERE = Path(__file__).parent
FILES = sorted(p for p in HERE.glob("test_answers_*.py") if p.name != Path(__file__).name)


def test_every_question_is_recomputed_over_the_seeds_or_listed_as_not_checkable():
    source = "".join(p.read_text(encoding="utf-8") for p in FILES)
    not_checked = set().union(*(importlib.import_module(p.stem).NOT_CHECKED for p in FILES))
    unlisted = [k for k in QUESTIONS if k not in not_checked and f'asked("{k}")' not in source]
    assert not unlisted, unlisted
    assert not_checked <= set(QUESTIONS), not_checked - set(QUESTIONS)  # no stale names
