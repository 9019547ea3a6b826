"""What a failed launch raises in the parent, what a rank raises when it times out, and
what every rank raises when the ranks of a group call a collective that does not agree."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A rank of a launched run failed. ``rank`` is the first rank that failed,
    ``remote_traceback`` its traceback as text (from the child process)."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


class CollectiveTimeout(LaunchError):
    """Some ranks waited longer than the launch's timeout in a collective that
    not every rank joined. ``waiting`` maps each waiting rank to the op it was in;
    ``finished`` lists the ranks that had already returned; ``last_collectives`` maps
    each rank to its last few collectives (`minitp.runtime._flight_recorder.Entry`),
    which the message shows as a table, naming the first the ranks disagree on."""

    def __init__(self, message: str, waiting: dict[int, str], finished: list[int],
                 last_collectives: dict | None = None):
        first = min(waiting) if waiting else None
        super().__init__(message, rank=first)
        self.waiting = waiting
        self.finished = finished
        self.last_collectives = last_collectives or {}


class RankTimedOut(RuntimeError):
    """Raised inside a rank when its collective times out; the launcher turns the
    reports of all ranks into one `CollectiveTimeout` in the parent."""

    def __init__(self, op: str, detail: str = ""):
        super().__init__(f"timed out in {op}" + (f" ({detail})" if detail else ""))
        self.op = op
        self.detail = detail


class CollectiveMismatch(ValueError):
    """The ranks of a group called a collective with calls that do not fit together:
    different collectives, shapes, dtypes, `src`, or all-to-all splits that one rank's
    receive and another's send disagree on. Raised on every rank of the group, before
    anything is sent, with the same message naming every rank's call
    (`minitp.runtime._collective_checks`)."""
