"""Which of the library's functions the learner's code called: the shortcuts a grader
forbids (ex12's `zb_h1`) or counts (ex17's calculator calls).

Calls are seen by the functions' code objects (a profile hook), so every call counts
however the learner imported the function: ``from minitp.calc import plan`` binds it
before any patch of the module could catch it, but its code is the same object.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable


class CallWatch:
    """While active, records each call of a watched function under its name: in order in
    ``calls``, and counted in ``runs[-1]`` once `new_run` has opened a run (one Counter
    per run of the learner's code)."""

    def __init__(self, watched: dict[Callable, str]):
        self.names = {function.__code__: name for function, name in watched.items()}
        self.calls: list[str] = []
        self.runs: list[Counter] = []

    def new_run(self) -> None:
        self.runs.append(Counter())

    def _hook(self, frame, event, arg):
        if event == "call" and frame.f_code in self.names:
            name = self.names[frame.f_code]
            self.calls.append(name)
            if self.runs:
                self.runs[-1][name] += 1

    def __enter__(self):
        self._before = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._before)
