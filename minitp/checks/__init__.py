"""The registry of exercises: which file each one is, and the checks that grade it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import ex01


@dataclass(frozen=True)
class Exercise:
    filename: str  # the same name in exercises/ and solutions/
    title: str
    run: Callable  # run(module) -> list[Check]


EXERCISES = {
    "ex01": Exercise("ex01_ring_allreduce.py", "ring all-reduce from send/recv", ex01.run),
}
