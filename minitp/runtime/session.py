"""``mt.session(N)``: ranks that stay alive between calls, each with a namespace of its own.

    s = mt.session(4, mesh="dp=2,tp=2")
    s.exec("w = torch.full((2,), float(rank))")    # on every rank; `w` stays there
    s.exec("mt.comm.all_reduce(w, mt.world())")     # -> a Run: run[r], run.trace, run.stdout
    s.get("w")[2]                                   # rank 2's w
    s.run(fn, ranks=[0, 2])                         # a function, as mt.launch runs it
    s.close()

The ranks come from `mt.launch`'s forkserver and join one process group once; each request
is a message down each rank's pipe and one answer back (`_session_rank`), so a trivial cell
costs milliseconds, not a launch (bench/session_cell.py). Failures are `mt.launch`'s reports:
an exception names its rank and line and leaves the group alive; a collective that not every
rank joins raises `CollectiveTimeout` after ``timeout``; a rank that dies is named. After the
last two, or an interrupt that caught a rank inside a collective, the group's connections may
hold half a message, so it is stopped: ``s.restart()`` starts it again, namespaces empty.
``%load_ext minitp`` gives the same in cells (`minitp.runtime.ranks_magic`).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import sys
import time

from ..rules import check_positive_int, check_timeout
from . import _pickling
from ._failure_report import raise_failure, raise_timeout, tail
from ._rank_set import _cell_sources
from ._run import Run
from ._session_group import RankGroup, parse_mesh
from ._session_rank import INTERRUPT_SIGNAL, INTERRUPTED, READY
from ._signals import interrupts_deferred
from ._worker import LIVE
from .errors import CollectiveTimeout, LaunchError

_FAILURE_GRACE_S = 0.25  # after a rank fails, how long the others may take to reach a collective
_INTERRUPT_WAIT_S = 2.0  # how long interrupted ranks may take to answer


class Cell(Run):
    """A `Run` of one request to a session: ``cell[r]`` is rank r's value (None for a rank
    not asked), ``cell.ranks`` the ranks that ran it; `show` prints both, labelled by rank."""

    def __init__(self, ranks, *args):
        super().__init__(*args)
        self.ranks = list(ranks)

    def show(self, values: bool = True) -> None:
        for rank in self.ranks:
            for stream, text in ((sys.stdout, self.stdout[rank]), (sys.stderr, self.stderr[rank])):
                for line in text.splitlines():
                    print(f"[rank {rank}] {line}", file=stream)
            if values and self[rank] is not None:
                for line in repr(self[rank]).splitlines():
                    print(f"[rank {rank}] {line}")


class Session(RankGroup):
    """``world_size`` live ranks; see the module's docstring. ``timeout``: seconds a rank
    may wait in one collective before the request fails with `CollectiveTimeout`."""

    def __init__(self, world_size: int, mesh=None, backend: str = "auto", timeout: float = 30.0):
        from .launch import _choose_backend
        check_positive_int("world_size", world_size)
        check_timeout(timeout)
        self.world_size, self.timeout = world_size, float(timeout)
        self.mesh = parse_mesh(mesh, world_size)
        self.backend = _choose_backend(backend, world_size)
        self.processes, self.conns, self.lifeline, self.directory = [], {}, None, None
        self.messages: dict = {}
        self.asked: list[int] = []
        self.start()

    # -- the group -------------------------------------------------------------------
    def restart(self) -> None:
        """Stop the ranks (their namespaces go with them) and start a fresh group."""
        self._stop("restarting")
        self.start()

    def close(self) -> None:
        self._stop("closed")
        atexit.unregister(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.stopped is None else f"stopped: {self.stopped}"
        return (f"Session(world_size={self.world_size}, mesh={self.mesh or None}, "
                f"backend={self.backend!r}, {state})")

    # -- requests --------------------------------------------------------------------
    def exec(self, code: str, ranks=None, *, name: str = "<ranks>") -> Cell:
        """Run ``code`` on the ranks (all, or the list ``ranks``) in each one's namespace;
        ``cell[r]`` is its last line's value if that line is an expression."""
        if not isinstance(code, str):
            raise TypeError(f"exec needs the code as a str, got {type(code).__name__}")
        return self._request("exec", code, ranks, filename=name)

    def run(self, fn, *args, ranks=None, **kwargs) -> Cell:
        """``fn(*args, **kwargs)`` on the ranks, as `mt.launch` would, on the live group."""
        if not callable(fn):
            raise TypeError(f"run needs a function, got {type(fn).__name__}")
        return self._request("run", _pickling.dumps((fn, args, kwargs)), ranks)

    def get(self, name: str, ranks=None) -> list:
        """Each rank's value of ``name`` (None for a rank not asked)."""
        return list(self._request("get", name, ranks))

    def _request(self, kind, body, ranks, filename=None) -> Cell:
        asked = self._check_ranks(ranks)
        if self.stopped is not None:
            raise LaunchError(f"the ranks are stopped ({self.stopped}): s.restart() "
                              "(%ranks restart) starts them again")
        started = time.perf_counter()
        request = {"kind": kind, "body": body, "t0": started, "filename": filename,
                   "sources": _cell_sources() if kind == "run" else {}}
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        self.messages, self.asked = {}, asked
        try:
            with interrupts_deferred():  # every asked rank gets the request whole
                for rank in asked:
                    try:
                        self.conns[rank].send_bytes(data)
                    except OSError:
                        pass  # it died: its sentinel says so below
        except KeyboardInterrupt:  # held while sending: the ranks have the cell; stop it
            self._interrupt()
            raise
        replies = self._collect(asked)
        n = self.world_size
        return Cell(asked, [self._value(r, replies) for r in range(n)],
                    [replies[r]["events"] if r in replies else [] for r in range(n)],
                    [replies[r]["stdout"] if r in replies else "" for r in range(n)],
                    [replies[r]["stderr"] if r in replies else "" for r in range(n)],
                    self.backend, time.perf_counter() - started)

    def _check_ranks(self, ranks) -> list[int]:
        if ranks is None:
            return list(range(self.world_size))
        asked = sorted({int(r) for r in ranks})
        if not asked or asked[0] < 0 or asked[-1] >= self.world_size:
            raise ValueError(f"ranks {list(ranks)}: each must be in 0..{self.world_size - 1}")
        return asked

    def _value(self, rank, replies):
        return pickle.loads(replies[rank]["result"]) if rank in replies else None

    def _collect(self, asked, starting=False) -> dict:
        """Wait for one answer from each asked rank, watching every rank's process."""
        self.messages, self.asked = {}, list(asked)
        failed_at, fine = None, READY if starting else "ok"
        try:
            while len(self.messages) < len(self.asked):
                pending = [r for r in self.asked if r not in self.messages]
                waiting = {self.conns[r]: r for r in pending}
                waiting.update({p.sentinel: r for r, p in enumerate(self.processes)})
                for ready in mp.connection.wait(list(waiting), timeout=0.25 if failed_at else 0.5):
                    self._read(waiting[ready], from_conn=ready is self.conns[waiting[ready]])
                if failed_at is None and any(m["status"] != fine for m in self.messages.values()):
                    failed_at = time.perf_counter()
                stuck = set(self.slots())
                if failed_at and time.perf_counter() - failed_at > _FAILURE_GRACE_S and \
                        stuck >= {r for r in self.asked if r not in self.messages}:
                    self._fail()  # the ranks left are waiting for one that failed
                if self._overdue(starting):
                    self._fail(timed_out=True)
        except KeyboardInterrupt:
            self._interrupt()
            raise
        if any(m["status"] != fine for m in self.messages.values()):
            self._fail()
        return self.messages

    def _read(self, rank, from_conn) -> None:
        with interrupts_deferred():  # a message half read would leave the pipe out of step
            try:
                while rank not in self.messages and self.conns[rank].poll():
                    message = pickle.loads(self.conns[rank].recv_bytes())
                    if message["status"] == LIVE:
                        sys.stderr.write(message["text"])  # a rank's console(), as it comes
                    else:
                        self.messages[rank] = message
                if from_conn or self.processes[rank].exitcode is None:
                    return
            except (EOFError, OSError):
                pass
        self._died(rank)

    def _died(self, rank) -> None:
        self.processes[rank].join(1.0)
        code = self.processes[rank].exitcode
        how = f"was killed by signal {-code}" if code and code < 0 else f"exited with code {code}"
        native = self.native_stderr(rank).rstrip()
        said = f", after printing:\n{tail(native, 20)}" if native else ""
        self._stop(f"rank {rank} died")
        raise LaunchError(f"rank {rank} of {self.world_size} {how}{said}\nThe other ranks were "
                          "stopped with it: s.restart() (%ranks restart) starts the group again, "
                          "with empty namespaces.", rank=rank, remote_traceback=native)

    def _fail(self, timed_out=False) -> None:
        """Raise the cell's failure; stop the group first unless every rank answered and
        none timed out (then the failure was the cell's own, and the group is sound)."""
        statuses = [m["status"] for m in self.messages.values()]
        sound = (len(self.messages) == len(self.asked) and not timed_out
                 and "timeout" not in statuses)
        try:
            if timed_out:
                raise_timeout(self, {r: what for r, (_, what) in self.slots().items()})
            raise_failure(self, {})
        except LaunchError as error:
            if not sound:
                self._stop("a collective was left unfinished")
                note = ("\nThe group was stopped (its connections may hold half a message): "
                        "s.restart() (%ranks restart) starts it again, with empty namespaces.")
                error.args = (str(error) + note,)
            raise error.with_traceback(None) from None

    def _interrupt(self) -> None:
        """Stop the cell on every rank still running it; keep the group if all answer and
        none was inside a collective."""
        pending = [r for r in self.asked if r not in self.messages]
        with interrupts_deferred():
            for rank in pending:
                os.kill(self.processes[rank].pid, INTERRUPT_SIGNAL)
            deadline = time.perf_counter() + _INTERRUPT_WAIT_S
            while pending and time.perf_counter() < deadline:
                for conn in mp.connection.wait([self.conns[r] for r in pending],
                                               timeout=deadline - time.perf_counter()):
                    rank = next(r for r in pending if self.conns[r] is conn)
                    try:
                        message = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        break
                    if message["status"] != LIVE:
                        self.messages[rank] = message
                pending = [r for r in self.asked if r not in self.messages]
            if pending or self.slots():
                self._stop("interrupted inside a collective")
                print("minitp: interrupted inside a collective; the group was stopped: "
                      "%ranks restart (s.restart()) starts it again", flush=True)
            else:
                stopped = sorted(r for r, m in self.messages.items() if m["status"] == INTERRUPTED)
                print(f"minitp: interrupted on ranks {stopped}; the group and its namespaces "
                      "are kept", flush=True)

def session(world_size: int, mesh=None, backend: str = "auto", timeout: float = 30.0) -> Session:
    """Start ``world_size`` ranks that stay alive between calls: see `Session`."""
    return Session(world_size, mesh=mesh, backend=backend, timeout=timeout)


__all__ = ["Cell", "CollectiveTimeout", "Session", "parse_mesh", "session"]
