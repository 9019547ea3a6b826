"""Graded questions: asked with concrete numbers drawn for each learner, checked, and
worked out after an attempt (`form`); one module per lesson holds its questions.

    q = mt.question("01.ring-bytes", seed="ada")
    q.check(...)
"""

from __future__ import annotations

from . import lesson01
from .form import Question, Verdict, Wrong

QUESTIONS = {
    "01.ring-bytes": lesson01.ring_bytes,
    "01.ring-time": lesson01.ring_time,
    "01.which-collective": lesson01.which_collective,
}


def question(key: str, seed=None) -> Question:
    """The question `key` with the numbers `seed` draws (any string: your name)."""
    if key not in QUESTIONS:
        raise ValueError(f"unknown question {key!r}; known: {', '.join(sorted(QUESTIONS))}")
    return QUESTIONS[key](seed)


__all__ = ["QUESTIONS", "Question", "Verdict", "Wrong", "question"]
