"""What the part-by-part graders (ex02, ex03) share: the run of every part on the ranks,
and the judgement of one part's numbers over every size and rank.

Each exercise has several parts (functions or classes the learner writes). On
every rank, each part runs on its own — an exception in one is reported, not
fatal to the rest — and the ranks meet on a group of the grader's own between
parts, so a collective one rank skipped cannot pair with the next part's. The
parent then judges numbers and traces per part.
"""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from ...runtime import comm, trace
from ...runtime.errors import LaunchError, RankTimedOut
from ...runtime.launch import launch
from ...runtime.mesh import Axis, world
from .base import Check, failure_check


def _err(got, expected) -> float:
    if got is None:
        return float("inf")
    return (got.detach().double() - expected).abs().max().item()


class Measure:
    """Errors of one part on one rank: name -> largest error, plus what went wrong."""

    def __init__(self):
        self.errors, self.problem, self.mistakes = {}, None, []

    def compare(self, name, got, expected):
        if self.problem:
            return
        if got is None:
            self.problem = f"{name} is None (no gradient reached it)"
        elif not isinstance(got, torch.Tensor):
            self.problem = f"{name} is a {type(got).__name__}, not a tensor"
        elif got.shape != expected.shape:
            self.problem = (f"{name} has shape {tuple(got.shape)}, expected "
                            f"{tuple(expected.shape)}")
        else:
            self.errors[name] = _err(got, expected)

    def result(self, ops):
        return {"errors": self.errors, "problem": self.problem, "mistakes": self.mistakes,
                "ops": ops}


def ops_since(start):
    return [e.op for e in trace.events()[start:] if e.is_comm]


def describe_exception(exc: BaseException) -> dict:
    """An exception raised by the learner's code, as plain data for the parent."""
    where = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if frame.f_globals.get("__name__", "").startswith("minitp_graded"):
            where = f"{frame.f_code.co_qualname} (line {line})"
    message = str(exc).strip()
    return {"type": type(exc).__name__, "message": message, "where": where}


def run_parts(functions: dict, ns: dict) -> dict:
    """Run each part on this rank, an exception in one not stopping the rest: part -> result."""
    axis = world()
    # The ranks meet between parts on a group of their own, so that a collective one rank
    # skipped cannot pair up with another part's: the run then stops, with a timeout here.
    group = dist.new_group(list(range(axis.size)), timeout=timedelta(seconds=10))
    between = Axis("grader", axis.ranks, axis.rank, group)
    results = {}
    for part, function in functions.items():
        try:
            results[part] = function(ns, axis)
        except RankTimedOut:
            raise  # a deadlock: the launcher names every waiting rank
        except Exception as exc:  # noqa: BLE001 - the learner's error, reported politely
            results[part] = {"exception": describe_exception(exc)}
        with trace.paused():
            comm.barrier(between)
    return results


def exception_check(name, t, rank, info, hint: str = "") -> Check:
    where = f" in {info['where']}" if info["where"] else ""
    if info["type"] == "NotImplementedError":
        what = info["where"].split(" (")[0] if info["where"] else "a part of the exercise"
        return Check(name, False, f"{what} is not written yet", rank=rank,
                     hint=info["message"].strip("'\"") or "replace the NotImplementedError "
                     "with your code")
    message = info["message"].splitlines()[0] if info["message"] else ""
    if len(message) > 160:
        message = message[:157] + "..."
    return Check(name, False, f"t={t}, rank {rank} raised {info['type']}{where}: {message}",
                 rank=rank, hint=hint or "read the error above; the docstrings say each "
                 "tensor's shape")


def judge_numbers(part, name, outcomes, tolerance, hint, exception_hint=None,
                  joiner=", ") -> Check:
    """One part's check: the first rank (at the first size) whose part raised, found a
    problem, or has a tensor off by more than ``tolerance`` fails it, with the hint
    ``hint(part, mistakes)`` (``exception_hint(info)`` for an exception, if given); else
    the largest error over every size (named ``joiner``-separated) and rank."""
    worst = 0.0
    for t, per_rank in outcomes:
        for rank, results in enumerate(per_rank):
            res = results[part]
            if "exception" in res:
                info = res["exception"]
                return exception_check(name, t, rank, info,
                                       exception_hint(info) if exception_hint else "")
            if res["problem"]:
                return Check(name, False, f"t={t}, rank {rank}: {res['problem']}", rank=rank,
                             hint=hint(part, res["mistakes"]))
            for tensor, error in res["errors"].items():
                if error > tolerance:
                    return Check(name, False, f"t={t}, rank {rank}: {tensor} is off by up to "
                                 f"{error:.3g}", rank=rank, tensor=tensor, max_error=error,
                                 hint=hint(part, res["mistakes"]))
                worst = max(worst, error)
    sizes = joiner.join(str(t) for t, _ in outcomes)
    return Check(name, True, f"t = {sizes}: largest error {worst:.1e}", max_error=worst)


def grade_in_parts(module, names, titles, world_sizes, in_rank, judge,
                   judge_trace) -> list[Check]:
    """Run `in_rank` at each world size and judge every part; a blank stops early."""
    ns = {name: getattr(module, name) for name in names}
    outcomes, failure = [], None
    for t in world_sizes:
        try:
            per_rank = launch(in_rank, t, ns, timeout=10.0)
        except LaunchError as error:
            failure = (t, error)
            break
        outcomes.append((t, list(per_rank)))
        if all("exception" in res and res["exception"]["type"] == "NotImplementedError"
               for res in per_rank[0].values()):
            break  # a blank: the other sizes would only say the same
    checks = []
    for key, name in titles.items():
        if failure and not outcomes:
            checks.append(failure_check(name, failure[1], "the exercise"))
            continue
        check = judge_trace(name, outcomes) if key == "trace" else judge(key, name, outcomes)
        if check.passed and failure:
            t, error = failure
            check = failure_check(name, error, "the exercise")
            check.detail = f"t={t}: {check.detail}"
        checks.append(check)
    return checks
