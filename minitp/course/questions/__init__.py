"""Graded questions: asked with concrete numbers drawn for each learner, checked, and
worked out after an attempt (`form`); one module per lesson, ``lessonNN.py``, holds its
questions in a ``QUESTIONS`` dict, keyed "NN.name" (the lesson's number first).

    q = mt.question("01.ring-bytes", seed="ada")
    q.check(...)
"""

from __future__ import annotations

import importlib
import pkgutil

from .form import Question, Verdict, Wrong


def _collect() -> dict:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("lesson"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            found.update(module.QUESTIONS)
    return found


QUESTIONS = _collect()


def question(key: str, seed=None) -> Question:
    """The question `key` with the numbers `seed` draws (any string: your name)."""
    if key not in QUESTIONS:
        raise ValueError(f"unknown question {key!r}; known: {', '.join(sorted(QUESTIONS))}")
    return QUESTIONS[key](seed)


__all__ = ["QUESTIONS", "Question", "Verdict", "Wrong", "question"]
