"""One launch's ranks, from start to end: start them (each with its lifeline and status
slot), wait on every pipe and process at once, copy console text as it comes, read each
rank's one final message, and stop and free everything however the launch ends."""

from __future__ import annotations

import ctypes
import linecache
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import socket
import sys
import time

from ._failure_report import raise_failure, raise_timeout
from ._flight_recorder import RING_BYTES
from ._forkserver import (
    EXIT_WAIT_S,
    RENDEZVOUS_PREFIX,
    context,
    make_owned_directory,
    remove_what_dead_launchers_left,
    warm_up,
    without_main_module,
)
from ._run import Run
from ._signals import cleaned_up_on_sigterm, interrupts_deferred
from ._worker import LIVE, STATUS_SLOT_BYTES, native_stderr_path, read_native_stderr
from ._worker import main as _rank_main
from .errors import LaunchError

_FAILURE_GRACE_S = 0.15  # after a first failure, how long to listen for its root cause


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        if name in ("lo", "lo0"):
            return name
    return None


def _cell_sources() -> dict:
    """linecache entries for code that has no file (IPython registers each cell's
    source this way, with no modification time), so a rank's traceback through a
    function defined in a notebook cell shows its lines, as a local one would."""
    return {name: entry for name, entry in list(linecache.cache.items())
            if len(entry) == 4 and entry[1] is None}


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _console_size_env() -> dict:
    """The launcher's terminal size, for ranks whose console is a pipe to it: tqdm
    reads COLUMNS when it cannot ask the terminal itself."""
    if "COLUMNS" in os.environ or not _isatty(sys.stderr):
        return {}
    size = shutil.get_terminal_size()
    return {"COLUMNS": str(size.columns), "LINES": str(size.lines)}


def _threads_per_rank(world_size: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world_size)


class Launch:
    def __init__(self, payload, world_size, backend, timeout):
        self.payload, self.world_size, self.backend, self.timeout = (
            payload, world_size, backend, timeout,
        )
        # Where ranks' console text goes (`minitp.runtime._worker.console`): this process's
        # stderr as it is now, i.e. the terminal, or the cell that runs the launch.
        self.console = sys.stderr
        self.processes: list = []
        self.conns: dict[int, mp.connection.Connection] = {}
        self.messages: dict[int, dict] = {}

    def run(self) -> Run:
        with cleaned_up_on_sigterm():
            return self._run()

    def _run(self) -> Run:
        ctx = context()
        started = time.perf_counter()
        remove_what_dead_launchers_left()
        warm_up(ctx)
        self.status = ctx.RawArray(ctypes.c_char, STATUS_SLOT_BYTES * self.world_size)
        self.flight = ctx.RawArray(ctypes.c_char, RING_BYTES * self.world_size)  # last collectives
        env = {"OMP_NUM_THREADS": str(_threads_per_rank(self.world_size)), **_console_size_env()}
        interface = _loopback_interface()
        if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = interface
        sources = _cell_sources()
        self.directory, lifeline_in, self.lifeline = None, None, None
        try:
            with interrupts_deferred():
                self.directory = make_owned_directory(f"{RENDEZVOUS_PREFIX}{os.getpid()}-")
                # Never written to: when its one write end closes (the launch is over,
                # or this process died), every rank still running ends. See _worker.
                lifeline_in, self.lifeline = ctx.Pipe(duplex=False)
            store_path = os.path.join(self.directory, "store")
            for rank in range(self.world_size):
                with interrupts_deferred():
                    self._start_rank(ctx, rank, store_path, started, env, lifeline_in, sources)
            lifeline_in.close()
            self._collect()
            self._release()
            results = [self._result(rank) for rank in range(self.world_size)]
            native = [self.native_stderr(rank) for rank in range(self.world_size)]
        finally:
            with interrupts_deferred():
                self._stop_all()
                for end in (lifeline_in, self.lifeline):
                    if end is not None:
                        end.close()
                if self.directory is not None:
                    shutil.rmtree(self.directory, ignore_errors=True)
        return Run(
            results,
            [self.messages[r]["events"] for r in range(self.world_size)],
            [self.messages[r]["stdout"] for r in range(self.world_size)],
            [self.messages[r]["stderr"] + native[r] for r in range(self.world_size)],
            self.backend,
            time.perf_counter() - started,
        )

    def _start_rank(self, ctx, rank, store_path, started, env, lifeline_in, sources) -> None:
        # A method of its own so that no frame of `_run` holds a process or pipe end:
        # an interrupt's traceback (kept by Jupyter as sys.last_traceback) keeps every
        # frame's locals alive, and with them descriptors the launch has finished with.
        parent_end, child_end = ctx.Pipe(duplex=True)
        self.conns[rank] = parent_end
        process = ctx.Process(
            target=_rank_main,
            name=f"minitp-rank{rank}",
            args=(rank, self.world_size, self.payload, store_path, self.backend,
                  self.timeout, _threads_per_rank(self.world_size), child_end,
                  self.status, self.flight, started, env, lifeline_in,
                  native_stderr_path(self.directory, rank), sources, _isatty(self.console)),
            daemon=True,
        )
        with without_main_module():
            process.start()
        self.processes.append(process)
        child_end.close()

    def _result(self, rank: int):
        try:
            return pickle.loads(self.messages[rank]["result"])
        except Exception as exc:  # noqa: BLE001 - whatever unpickling raised, name the rank
            raise LaunchError(
                f"rank {rank} of {self.world_size} returned a value that cannot be rebuilt "
                f"in this process: {type(exc).__name__}: {exc}\n(it pickled there but not "
                "here: a class or module the launching process lacks?)",
                rank=rank,
            ) from None

    def native_stderr(self, rank: int) -> str:
        """What rank `rank`'s native (C++) side wrote to file descriptor 2."""
        return read_native_stderr(self.directory, rank)

    # -- waiting ---------------------------------------------------------------
    def _collect(self) -> None:
        """Wait for one message from every rank; raise at the first failure."""
        deaths: dict[int, int] = {}
        failure_seen_at = None
        while len(self.messages) + len(deaths) < self.world_size:
            waiting_on = {}
            for rank, process in enumerate(self.processes):
                if rank in self.messages or rank in deaths:
                    continue
                waiting_on[self.conns[rank]] = rank
                waiting_on[process.sentinel] = rank
            poll = _FAILURE_GRACE_S if failure_seen_at else 0.5
            for ready in mp.connection.wait(list(waiting_on), timeout=poll):
                rank = waiting_on[ready]
                if rank in self.messages or rank in deaths:
                    continue
                if ready is self.conns[rank]:
                    try:
                        self._receive(rank)
                    except (EOFError, OSError):
                        deaths[rank] = self._exit_code(rank)
                else:  # the process ended; a message it sent may still be in the pipe
                    try:
                        while rank not in self.messages and self.conns[rank].poll():
                            self._receive(rank)
                    except (EOFError, OSError):
                        pass
                    if rank not in self.messages:
                        deaths[rank] = self._exit_code(rank)
            failed = deaths or any(m["status"] != "ok" for m in self.messages.values())
            overdue = self._overdue_waiters()
            if failed and failure_seen_at is None:
                failure_seen_at = time.perf_counter()
            if failure_seen_at and time.perf_counter() - failure_seen_at >= _FAILURE_GRACE_S:
                raise_failure(self, deaths)
            if overdue and not failed:
                raise_timeout(self, overdue)
        if deaths or any(m["status"] != "ok" for m in self.messages.values()):
            raise_failure(self, deaths)

    def _receive(self, rank: int) -> None:
        """Read one message from rank `rank`: console text is copied to this process's
        stderr at once (a progress bar, as it advances); anything else is the rank's
        one final message."""
        message = pickle.loads(self.conns[rank].recv_bytes())
        if message["status"] == LIVE:
            self.console.write(message["text"])
            self.console.flush()
        else:
            self.messages[rank] = message

    def _exit_code(self, rank: int) -> int:
        self.processes[rank].join(1.0)
        code = self.processes[rank].exitcode
        return code if code is not None else -1

    def slots(self) -> dict[int, tuple[float, str]]:
        """What each rank is waiting in right now, and since when (wall clock)."""
        slots = {}
        raw = self.status.raw
        for rank in range(self.world_size):
            chunk = raw[rank * STATUS_SLOT_BYTES:(rank + 1) * STATUS_SLOT_BYTES].split(b"\0")[0]
            if chunk:
                since, _, what = chunk.decode(errors="replace").partition("|")
                slots[rank] = (float(since), what)
        return slots

    def _overdue_waiters(self) -> dict[int, str]:
        # A backstop: backends time out by themselves, but if one doesn't, we do
        # (a couple of seconds later, so the backend's own report wins when it comes).
        slots = self.slots()
        now = time.time()
        if any(now - since > self.timeout + 2.0 for since, _ in slots.values()):
            return {rank: what for rank, (_, what) in slots.items()}
        return {}

    # -- ending ----------------------------------------------------------------
    def _release(self) -> None:
        for conn in self.conns.values():
            try:
                conn.send_bytes(b"done")
            except OSError:
                pass
        deadline = time.perf_counter() + EXIT_WAIT_S
        for process in self.processes:
            process.join(max(0.0, deadline - time.perf_counter()))

    def _stop_all(self) -> None:
        """Kill whatever is still running, free every pipe and process handle, and
        drop every reference to them and to the shared status array.

        Dropping matters as much as closing: the status array lives in a
        multiprocessing heap arena (a file in /dev/shm, two descriptors) that is
        only released when the last reference goes, and an interrupted launch's
        traceback keeps `self` alive until the garbage collector next runs.
        """
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(EXIT_WAIT_S)
            if process.exitcode is not None:
                process.close()
        for conn in self.conns.values():
            conn.close()
        self.processes, self.conns, self.status, self.flight = [], {}, None, None
