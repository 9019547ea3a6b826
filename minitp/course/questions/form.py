"""The question form: a question asked with concrete numbers, answered in a code cell,
checked, and its worked answer shown only after an attempt.

    q = mt.question("01.ring-bytes", seed="ada")   # your own numbers, drawn from the seed
    q                                               # the question
    q.check(3.5e9)                                  # right, or which mistake it looks like
    q.check(lambda n, S: 2 * (n - 1) / n * S)       # a formula: kind "formula"

A `Question` draws its parameters from the seed (the same seed, the same numbers; another
seed, other numbers, so answers cannot be copied), computes the right answer from them
(the calculator, or the rule the lesson derived), and knows the usual wrong answers, each
with a sentence saying what it is. `check` says whether the answer is right, or names the
mistake it matches, and then shows the worked answer: the derivation and its number. An
answer not given yet (``None`` or ``...``) is told so, and nothing is revealed.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("number", "choice", "formula")


@dataclass
class Wrong:
    """A usual wrong answer: its value (from the parameters) and what it is, in a sentence."""

    value: Callable[[dict], object]
    says: str


@dataclass
class Question:
    """One question. `draw(rng)` picks the parameters; `text`, `right`, `worked` and every
    `Wrong` are computed from them. `kind`: "number" (within `rel_tol`), "choice", or
    "formula": a function of the named `symbols`, compared with the right one at random
    points drawn from `points` (symbol -> (low, high), whole numbers where both are int)."""

    key: str
    draw: Callable[[random.Random], dict]
    text: Callable[[dict], str]
    right: Callable[[dict], object]
    worked: Callable[[dict], str]
    wrong: list[Wrong] = field(default_factory=list)
    kind: str = "number"
    rel_tol: float = 0.01
    seed: str | None = None
    points: dict = field(default_factory=dict)  # formula: symbol -> (low, high)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"a question's kind is one of {KINDS}, got {self.kind!r}")
        digest = hashlib.sha256(f"{self.key}/{self.seed}".encode()).digest()
        self.params = self.draw(random.Random(int.from_bytes(digest[:8], "big")))

    def _repr_markdown_(self) -> str:
        return f"**Question {self.key}.** {self.text(self.params)}"

    def __repr__(self) -> str:
        return f"Question {self.key}: {self.text(self.params)}"

    def check(self, answer) -> Verdict:
        """Whether `answer` is right; if not, which usual mistake it matches. The worked
        answer comes with the verdict, after an attempt only."""
        if answer is None or answer is Ellipsis:
            return Verdict(self, None, "put your answer in place of ... and run the cell "
                                       "again (the worked answer appears after an attempt)")
        try:
            if self._same(answer, self.right(self.params)):
                return Verdict(self, True, "right")
            for mistake in self.wrong:
                if self._same(answer, mistake.value(self.params)):
                    return Verdict(self, False, mistake.says)
        except (TypeError, ValueError) as exc:
            return Verdict(self, False, f"that is not an answer of this kind ({exc})")
        return Verdict(self, False, "not the answer, and not one of the usual mistakes either: "
                                    "compare your steps with the worked answer below")

    def _same(self, answer, expected) -> bool:
        if self.kind == "choice":
            return str(answer).strip().lower() == str(expected).lower()
        if self.kind == "formula":
            return self._same_formula(answer, expected)
        answer = float(answer)
        if not math.isfinite(answer):
            raise ValueError(f"{answer} is not a finite number")
        return math.isclose(answer, float(expected), rel_tol=self.rel_tol)

    def _same_formula(self, answer, expected) -> bool:
        """Equal at 20 random points of `points` (the same points for every answer)."""
        if not callable(answer):
            raise TypeError("a formula is a function of the symbols, e.g. lambda n, S: ...")
        rng = random.Random(self.key)
        for _ in range(20):
            at = {name: (rng.randint(lo, hi) if isinstance(lo, int) and isinstance(hi, int)
                         else rng.uniform(lo, hi)) for name, (lo, hi) in self.points.items()}
            try:
                got = float(answer(**at))
            except Exception as exc:  # the learner's function: any error is an answer's fault
                raise ValueError(f"your function raised {type(exc).__name__} at {at}") from exc
            if not math.isclose(got, float(expected(**at)), rel_tol=self.rel_tol):
                return False
        return True


@dataclass
class Verdict:
    """What `Question.check` found; shows itself in a notebook (the worked answer too,
    once there was an attempt)."""

    question: Question
    right: bool | None  # None: no answer yet
    says: str

    @property
    def revealed(self) -> str | None:
        return None if self.right is None else self.question.worked(self.question.params)

    def __str__(self) -> str:
        mark = {True: "RIGHT", False: "NOT YET", None: "NO ANSWER YET"}[self.right]
        lines = [f"{self.question.key}: {mark}: {self.says}"]
        if self.revealed:
            lines += ["", "Worked answer: " + self.revealed]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        mark = {True: "✓ right", False: "✗ not yet", None: "… no answer yet"}[self.right]
        text = f"**{self.question.key}: {mark}.** {self.says}"
        if self.revealed:
            text += f"\n\n*Worked answer.* {self.revealed}"
        return text
