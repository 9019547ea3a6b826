"""What every grader shares: the result types, the run at each world size, and what
an in-process grader (ex16, ex17) reports for a blank, a crash or a shortcut taken.

The bottom of the grader: the checks of each exercise (``graders/exNN.py``) build
on this module, the registry (``graders/__init__.py``) on them, and
``minitp.course.grading`` on the registry. So this module imports nothing of theirs,
nor the ``minitp`` facade (whose `mt.grade` imports the grader): only leaf modules.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...runtime.errors import CollectiveTimeout, LaunchError


@dataclass
class Check:
    """One graded property: what was checked, whether it held, and if not, why."""

    name: str
    passed: bool
    detail: str = ""
    rank: int | None = None
    tensor: str = ""
    max_error: float | None = None
    hint: str = ""

    def lines(self) -> list[str]:
        mark = "PASS" if self.passed else "FAIL"
        out = [f"  {mark}  {self.name}" + (f": {self.detail}" if self.detail else "")]
        if not self.passed and self.hint:
            out += textwrap.wrap(self.hint, 88, initial_indent="        hint: ",
                                 subsequent_indent="              ")
        return out


@dataclass
class Report:
    """Every check of one exercise. Displays itself; ``.passed`` is True when all held."""

    exercise: str
    title: str
    source: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def __str__(self) -> str:
        good = sum(c.passed for c in self.checks)
        head = f"{self.exercise} · {self.title}: {good}/{len(self.checks)} checks passed"
        lines = [head, f"  (graded {self.source})"]
        for check in self.checks:
            lines += check.lines()
        if self.passed:
            lines.append("  All checks passed. Well done!")
        return "\n".join(lines)

    __repr__ = __str__


def file_lacks(names: Sequence[str], missing: str) -> list[Check]:
    """Every check failed the same way: the learner's file has no ``missing`` (a name
    renamed or deleted), so nothing could be run."""
    return [Check(n, False, f"the file has no {missing}",
                  hint="keep the names of the exercise file") for n in names]


def not_written(names: Sequence[str], function: str, hint: str) -> list[Check]:
    """The checks of an exercise whose ``function`` is still a blank, for a grader that
    calls the learner's code in this process: the first says so, with the blank's hint."""
    return ([Check(names[0], False, f"{function} is not written yet", hint=hint)]
            + [Check(n, False, f"not checked: {function} is not written yet")
               for n in names[1:]])


def crashed(names: Sequence[str], label: str, error: Exception, hint: str) -> list[Check]:
    """The checks of an exercise whose code raised in this process on case ``label``."""
    detail = f"{label}: raised {type(error).__name__}: {error}"
    return ([Check(names[0], False, detail, hint=hint)]
            + [Check(n, False, "not checked: the call above failed") for n in names[1:]])


def no_shortcut(name: str, calls: Sequence[str], hint: str) -> Check:
    """Whether the learner's code called none of the functions that give the answer away
    (``calls``: the names a watch recorded while it ran)."""
    if calls:
        return Check(name, False, f"your code called {', '.join(sorted(set(calls)))}",
                     hint=hint)
    return Check(name, True, "no shortcut taken")


class Stopped(Exception):
    """The learner's code, called in this process, failed: ``checks`` are every check of
    the exercise, failed the way `not_written` or `crashed` says."""

    def __init__(self, checks: list[Check]):
        super().__init__(checks[0].detail)
        self.checks = checks


def attempt(function: Callable, *args, names: Sequence[str], blank: str, label: str,
            hint: str):
    """The learner's ``function(*args)``, in this process. A blank (NotImplementedError)
    raises `Stopped` with `not_written` under the name ``blank``; any other exception,
    with `crashed` on case ``label`` and ``hint``."""
    try:
        return function(*args)
    except NotImplementedError as exc:
        raise Stopped(not_written(names, blank, str(exc))) from None
    except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
        raise Stopped(crashed(names, label, exc, hint)) from None


def call_kept(fn, *args):
    """On a rank: (result, None), or (None, (kind, message)) when the learner's function
    raised, kind "blank" (NotImplementedError) or "crash", kept for the parent to judge."""
    try:
        return fn(*args), None
    except NotImplementedError as exc:
        return None, ("blank", str(exc))
    except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
        return None, ("crash", f"{type(exc).__name__}: {exc}")


def kept_failure(function: str, why: tuple[str, str], hint: str) -> tuple[bool, str, str]:
    """(False, detail, hint) for a learner's `function` that `call_kept` caught on a rank:
    a blank says it is not written yet (with the blank's own hint), a crash what it raised."""
    kind, message = why
    if kind == "blank":
        return False, f"{function} is not written yet", message or hint
    verb = "returned" if kind == "returned" else "raised"
    return False, f"{function} {verb} {message}", hint


def judge_parts(names: Sequence[str], parts: Sequence[Callable],
                per_rank: Sequence) -> list[Check]:
    """One check per name: its part, ``part(record) -> (passed, detail, hint)``, fails at the
    first rank whose record fails it; else it passes, saying what rank 0's record says."""
    checks = []
    for name, part in zip(names, parts, strict=True):
        for rank, record in enumerate(per_rank):
            passed, detail, hint = part(record)
            if not passed:
                checks.append(Check(name, False, detail, rank=rank, hint=hint))
                break
        else:
            checks.append(Check(name, True, part(per_rank[0])[1]))
    return checks


def failure_check(name: str, error: LaunchError, what: str) -> Check:
    """Turn a failed launch of the learner's code into a polite, specific failed check."""
    if isinstance(error, CollectiveTimeout):
        waits = "; ".join(f"rank {r} in {op}" for r, op in error.waiting.items())
        return Check(name, False, f"the ranks never met: {waits}", rank=error.rank,
                     hint="every rank must make the same communication calls, in the same "
                          "order (a deadlock or a missing call)")
    last = (error.remote_traceback or str(error)).strip().splitlines()[-1]
    if "NotImplementedError" in last:
        text = last.partition(":")[2].strip().strip("'\"")
        return Check(name, False, f"{what} is not written yet", rank=error.rank,
                     hint=text or "replace the NotImplementedError with your code")
    return Check(name, False, f"rank {error.rank} raised {last}", rank=error.rank,
                 hint=_where(error.remote_traceback))


def _where(traceback_text: str) -> str:
    frames = [ln.strip() for ln in traceback_text.splitlines() if ln.strip().startswith("File ")]
    mine = [f for f in frames if "minitp_graded" in f or "exercises" in f or "solutions" in f]
    if mine:
        return f"look at {mine[-1]}"
    return "read the traceback: print(err.remote_traceback) after catching mt.LaunchError"


def run_per_size(
    world_sizes: Sequence[int],
    names: Callable[[int], list[str]],
    launch_at: Callable[[int], Sequence],
    judge: Callable[[int, list[str], Sequence], list[Check]],
    *,
    what: str,
    size: str,
    blank: Callable[[Sequence, list[Check]], str | None] | None = None,
) -> list[Check]:
    """Run the learner's code at each world size and judge it, one list of checks per size.

    At world size n: ``names(n)`` are that size's checks (the first one carries a
    failed launch), ``launch_at(n)`` runs the ranks and returns what each found
    (raising `LaunchError`), ``judge(n, names, per_rank)`` makes the checks.
    ``blank(per_rank, checks)``, if given, says what the learner has left blank
    ("the forward is not written yet"), or None when nothing is.

    A blank or a deadlock would only repeat itself at the next size (and a
    deadlock costs a timeout each time), so every later size is reported, check
    by check, as "not run: <why> (see <size>=<n>)" with `size` "n", "t" or "dp".
    """
    checks, stop = [], None
    for n in world_sizes:
        these = names(n)
        if stop:
            checks += [Check(name, False, stop) for name in these]
            continue
        try:
            per_rank = launch_at(n)
        except LaunchError as error:
            failed = failure_check(these[0], error, what)
            checks += [failed] + [Check(name, False, "not checked: the run above failed")
                                  for name in these[1:]]
            if isinstance(error, CollectiveTimeout) or "not written yet" in failed.detail:
                stop = f"not run: {failed.detail} (see {size}={n})"
            continue
        judged = judge(n, these, per_rank)
        checks += judged
        why = blank(per_rank, judged) if blank else None
        if why:
            stop = f"not run: {why} (see {size}={n})"
    return checks
