"""``mt.launch(fn, world_size)``: run a function on N real processes, get back what each returned.

How, and why (the start-up times are measured by bench/launch.py):

* Ranks are forked from a *forkserver* that has torch and minitp imported
  already, so a launch costs a fraction of a second instead of a fresh
  interpreter importing torch per rank (``spawn``). Plain ``fork`` is unsafe
  from a Jupyter kernel (it has threads) and cannot re-initialise CUDA.
* ``fn`` travels as cloudpickle bytes, so a function (or closure) defined in a
  notebook cell runs on every rank.
* The rendezvous is a file store in a fresh temporary directory, not a TCP
  store on a port: nothing to race for, and (measured, torch 2.13) a TCP store
  client now and then stalls 5 s on connect. gloo's own connections bind to
  the loopback interface on ports the kernel picks.
* Each rank sends back exactly one message. The parent waits on all pipes and
  process sentinels at once, so the first failure is seen at once; then every
  rank is killed and the failure raised here, naming the rank.
* While a rank waits inside a collective it writes what it waits in to a small
  shared-memory slot; a rank that waits longer than ``timeout`` makes the whole
  run fail with `CollectiveTimeout` naming every waiting rank and its op.

Under ``torchrun`` (its environment variables set) `launch` does not start
processes: it runs ``fn`` in place, on the process group torchrun set up, and
gathers every rank's return value so ``run[r]`` means the same thing.

Why one file: starting ranks, watching them and tearing them down are one
life cycle sharing the same handles (processes, pipes, status slots, the store
directory); split apart, each half would need the other's internals. What
runs *inside* a rank lives in `minitp._worker`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import linecache
import math
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.spawn as mp_spawn
import multiprocessing.util as mp_util
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _device, _pickling, trace
from ._processes import alive
from ._worker import LIVE, STATUS_SLOT_BYTES
from ._worker import console as console
from ._worker import dumps as _dump_result
from ._worker import main as _rank_main
from .errors import CollectiveTimeout, LaunchError
from .trace import Event

# torch._dynamo: torch.utils.checkpoint imports it on first use, >1 s per rank;
# preloaded, the forkserver pays it once (measured: activation_table 5 s -> 1.6 s).
_PRELOAD = ["minitp", "minitp._worker", "torch._dynamo"]  # the whole package, torch with it
_FAILURE_GRACE_S = 0.15  # after a first failure, how long to listen for its root cause
_EXIT_WAIT_S = 5.0  # how long a rank may take to leave before it is killed
_CASCADE_PATTERN = ("Connection closed by peer", "Connection reset", "Broken pipe", "EOF")
DEBUG_ENV = "MINITP_DEBUG"  # set it (to anything) to keep minitp's frames in launch errors
_NATIVE_STDERR_LINES = 20  # how much of a rank's C++ stderr a failure report quotes


class Run(Sequence):
    """What a launch produced: ``run[r]`` is rank r's return value.

    ``run.trace`` holds every rank's `Event` in time order, ``run.stdout[r]``
    and ``run.stderr[r]`` what rank r printed (kept apart, never interleaved).
    """

    def __init__(self, results, events, stdout, stderr, backend, seconds):
        self._results = list(results)
        self.trace: list[Event] = trace.merge(events)
        self.stdout: list[str] = list(stdout)
        self.stderr: list[str] = list(stderr)
        self.backend = backend
        self.seconds = seconds

    @property
    def world_size(self) -> int:
        return len(self._results)

    def __getitem__(self, index):
        return self._results[index]

    def __len__(self) -> int:
        return len(self._results)

    def show_stdout(self) -> None:
        """Print what each rank printed, rank by rank."""
        for rank, text in enumerate(self.stdout):
            for line in text.splitlines() or ["(nothing)"]:
                print(f"[rank {rank}] {line}")

    def __repr__(self) -> str:
        comm = sum(1 for e in self.trace if e.is_comm)
        return (
            f"Run(world_size={self.world_size}, backend={self.backend!r}, "
            f"{len(self.trace)} events ({comm} communication), {self.seconds:.2f} s)"
        )


def launch(
    fn, world_size: int, *args, backend: str = "auto", timeout: float = 120.0, **kwargs
) -> Run:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` processes joined in one process group.

    backend: "auto" picks NCCL (rank r on cuda:r) when CUDA has at least
        ``world_size`` devices, else gloo on the CPU; or say "gloo" / "nccl".
    timeout: seconds a rank may wait in one collective (or the rendezvous)
        before the run fails with `CollectiveTimeout`.
    Returns a `Run`; raises `LaunchError` naming the first rank that failed.
    What ranks print comes back in ``run.stdout``/``run.stderr`` at the end; what a
    rank writes to `console()` (``from minitp.launch import console``: a progress bar)
    reaches this process's stderr as it is written.
    """
    if not callable(fn):
        raise TypeError(f"launch needs a function to run, got {type(fn).__name__}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if (not isinstance(timeout, int | float) or isinstance(timeout, bool)
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    if _under_torchrun():
        return _run_in_place(fn, world_size, args, kwargs, backend, timeout)
    backend = _choose_backend(backend, world_size)
    payload = _pickling.dumps((fn, args, kwargs))
    try:
        return _Launch(payload, world_size, backend, float(timeout)).run()
    except LaunchError as error:
        if os.environ.get(DEBUG_ENV):
            raise
        # The rank's traceback (in the message) is what the learner needs; the
        # launcher's own frames above it would only push it off the screen.
        raise error.with_traceback(None) from None


def _choose_backend(backend: str, local_ranks: int) -> str:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    chosen, why = _device.choose_backend(backend, local_ranks, gpus, dist.is_nccl_available())
    if backend == "auto" and chosen == "gloo" and gpus > 0:
        _say_once(why)
    return chosen


_said: set[str] = set()


def _say_once(line: str) -> None:
    """One line on stderr the first time a launch falls back from the GPUs it sees."""
    if line not in _said:
        _said.add(line)
        print(f"minitp: {line}", file=sys.stderr)


# --------------------------------------------------------------------------- processes
_context_cache = None


def _context():
    """A forkserver context whose server has torch and minitp imported (spawn where
    there is no forkserver, i.e. Windows)."""
    global _context_cache
    if _context_cache is None:
        if "forkserver" in mp.get_all_start_methods():
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(_PRELOAD)
        else:
            ctx = mp.get_context("spawn")
        _context_cache = ctx
    return _context_cache


_warm_forkserver_pid = None


def _warm_up(ctx) -> None:
    """Make sure the forkserver is running and has imported torch, *interruptibly*.

    Its first child waits for those imports (seconds, cold). Starting ranks happens
    with interrupts deferred (so no rank is ever half-started and lost), which is
    only acceptable if starting one takes milliseconds: so a throwaway child pays
    the cold start first, where an interrupt costs nothing (it exits at once).
    """
    global _warm_forkserver_pid
    if ctx.get_start_method() != "forkserver":
        return
    with _interrupts_deferred():
        mp_forkserver.ensure_running()
    # The server's pid is private to multiprocessing; without it, warm up every time.
    pid = getattr(mp_forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None and pid == _warm_forkserver_pid:
        return
    probe = ctx.Process(target=int, name="minitp-warm-up", daemon=True)
    try:
        with _without_main_module():
            probe.start()
        probe.join()
    except BaseException as stopped:
        # Cut short (Ctrl-C while the forkserver starts cold), a start leaves its
        # half-made Popen in the traceback's frames, holding two descriptors until the
        # garbage collector finds them; a started probe holds its sentinel. Free both now.
        if probe.pid is not None:
            probe.kill()
            probe.join(_EXIT_WAIT_S)
            if probe.exitcode is not None:
                probe.close()
        traceback.clear_frames(stopped.__traceback__)
        raise
    probe.close()
    _warm_forkserver_pid = pid
    _sign_multiprocessing_directory()


# ------------------------------------------------------------------ what a SIGKILL leaves
# A launcher killed with SIGKILL (a kernel restart, the OOM killer) runs no cleanup: its
# ranks and forkserver follow it (see _worker._die_with_launcher), but two directories
# stay in the temporary folder: the launch's rendezvous directory and multiprocessing's
# own `pymp-*` directory (the forkserver's socket). Each carries the launcher's pid, so
# the next launch, in any process, removes those whose launcher is gone.
_RENDEZVOUS_PREFIX = "minitp-"                # + "<launcher pid>-<random>"
_MULTIPROCESSING_MARK = "minitp-launcher-"    # + "<launcher pid>", a file in pymp-*


def _sign_multiprocessing_directory() -> None:
    """Mark this process's `pymp-*` directory as a minitp launcher's, with its pid."""
    mark = os.path.join(mp_util.get_temp_dir(), f"{_MULTIPROCESSING_MARK}{os.getpid()}")
    if not os.path.exists(mark):
        with contextlib.suppress(OSError):
            open(mark, "x").close()


def _remove_what_dead_launchers_left() -> None:
    folders = {tempfile.gettempdir(), os.path.dirname(mp_util.get_temp_dir())}
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(_RENDEZVOUS_PREFIX):
                pids = [entry.name.removeprefix(_RENDEZVOUS_PREFIX).split("-")[0]]
            elif entry.name.startswith("pymp-"):
                try:
                    pids = [name.removeprefix(_MULTIPROCESSING_MARK)
                            for name in os.listdir(entry.path)
                            if name.startswith(_MULTIPROCESSING_MARK)]
                except OSError:
                    continue
            else:
                continue
            if pids and all(_left_by_a_dead_launcher(entry, pid) for pid in pids):
                shutil.rmtree(entry.path, ignore_errors=True)


def _left_by_a_dead_launcher(entry: os.DirEntry, pid: str) -> bool:
    """A directory of this user's whose launcher (pid) no longer runs."""
    try:
        if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
            return False
    except OSError:
        return False
    return pid.isdigit() and not alive(int(pid))


@contextlib.contextmanager
def _interrupts_deferred():
    """Inside: Ctrl-C (SIGINT) and, during a launch, SIGTERM are held until the block
    ends, then acted on.

    For the short stretches that must not be cut in half: starting a rank (a rank
    forked but never recorded would be lost) and tearing a launch down (a second
    Ctrl-C would leave the rendezvous directory and pipes behind). Only the main
    thread can handle signals, and only Python's own handlers are replaced: a
    shell that ignores SIGINT keeps ignoring it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    replaced = {}
    for signum, ours in ((signal.SIGINT, signal.default_int_handler),
                         (signal.SIGTERM, _terminate)):
        if signal.getsignal(signum) is ours:
            replaced[signum] = ours
            signal.signal(signum, lambda received, _frame: held.append(received))

    def restore():
        for signum, handler in replaced.items():
            signal.signal(signum, handler)

    try:
        yield
    except BaseException:
        restore()
        if signal.SIGTERM in held:
            raise _Terminated from None
        raise  # already on its way out; a held Ctrl-C adds nothing
    restore()
    if signal.SIGTERM in held:
        raise _Terminated
    if held:
        raise KeyboardInterrupt


class _Terminated(BaseException):
    """SIGTERM arrived during a launch: tear it down, then die of SIGTERM as asked."""


def _terminate(_signum, _frame):
    raise _Terminated


@contextlib.contextmanager
def _cleaned_up_on_sigterm():
    """SIGTERM's default action ends the process on the spot, with no `finally`: the
    rendezvous directory would stay behind. During a launch, SIGTERM raises instead,
    the launch tears down, and then the signal is delivered again with its default
    action, so the process still dies of SIGTERM, as whoever sent it expects."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # What multiprocessing's exit handler would remove (the forkserver's socket
        # lives there); dying of the signal, this process runs no exit handlers.
        shutil.rmtree(mp_util.get_temp_dir(), ignore_errors=True)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _without_main_module():
    """Start ranks without re-running the parent's __main__ script in each of them.

    multiprocessing normally re-imports the main script in every child (hence the
    ``if __name__ == "__main__":`` idiom). Our ranks get ``fn`` by value through
    cloudpickle, so they need nothing from it, and a learner's unguarded script
    must not run once per rank.
    """
    original = mp_spawn.get_preparation_data

    def preparation_data(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    mp_spawn.get_preparation_data = preparation_data
    try:
        yield
    finally:
        mp_spawn.get_preparation_data = original


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


class _Launch:
    def __init__(self, payload, world_size, backend, timeout):
        self.payload, self.world_size, self.backend, self.timeout = (
            payload, world_size, backend, timeout,
        )
        # Where ranks' console text goes (`minitp._worker.console`): this process's
        # stderr as it is now, i.e. the terminal, or the cell that runs the launch.
        self.console = sys.stderr
        self.processes: list = []
        self.conns: dict[int, mp.connection.Connection] = {}
        self.messages: dict[int, dict] = {}

    def run(self) -> Run:
        with _cleaned_up_on_sigterm():
            return self._run()

    def _run(self) -> Run:
        ctx = _context()
        started = time.perf_counter()
        _remove_what_dead_launchers_left()
        _warm_up(ctx)
        self.status = ctx.RawArray(ctypes.c_char, STATUS_SLOT_BYTES * self.world_size)
        env = {"OMP_NUM_THREADS": str(_threads_per_rank(self.world_size)), **_console_size_env()}
        interface = _loopback_interface()
        if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = interface
        sources = _cell_sources()
        self.directory, lifeline_in, self.lifeline = None, None, None
        try:
            with _interrupts_deferred():
                self.directory = tempfile.mkdtemp(prefix=f"{_RENDEZVOUS_PREFIX}{os.getpid()}-")
                # Never written to: when its one write end closes (the launch is over,
                # or this process died), every rank still running ends. See _worker.
                lifeline_in, self.lifeline = ctx.Pipe(duplex=False)
            store_path = os.path.join(self.directory, "store")
            for rank in range(self.world_size):
                with _interrupts_deferred():
                    self._start_rank(ctx, rank, store_path, started, env, lifeline_in, sources)
            lifeline_in.close()
            self._collect()
            self._release()
            results = [self._result(rank) for rank in range(self.world_size)]
            native = [self._native_stderr(rank) for rank in range(self.world_size)]
        finally:
            with _interrupts_deferred():
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
                  self.status, started, env, lifeline_in,
                  self._native_stderr_path(rank), sources, _isatty(self.console)),
            daemon=True,
        )
        with _without_main_module():
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

    def _native_stderr_path(self, rank: int) -> str:
        return os.path.join(self.directory, f"rank{rank}.stderr")

    def _native_stderr(self, rank: int) -> str:
        """What rank `rank`'s native (C++) side wrote to file descriptor 2."""
        try:
            with open(self._native_stderr_path(rank), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

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
                self._raise_failure(deaths)
            if overdue and not failed:
                self._raise_timeout(overdue)
        if deaths or any(m["status"] != "ok" for m in self.messages.values()):
            self._raise_failure(deaths)

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

    def _slots(self) -> dict[int, tuple[float, str]]:
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
        slots = self._slots()
        now = time.time()
        if any(now - since > self.timeout + 2.0 for since, _ in slots.values()):
            return {rank: what for rank, (_, what) in slots.items()}
        return {}

    # -- failing ---------------------------------------------------------------
    def _raise_failure(self, deaths: dict[int, int]) -> None:
        errors = {r: m for r, m in self.messages.items() if m["status"] == "error"}
        timeouts = {r: m for r, m in self.messages.items() if m["status"] == "timeout"}
        root = [r for r, m in errors.items() if not _is_cascade(m["error"])]
        if root:
            rank = min(root)
            message = errors[rank]
            raise LaunchError(
                f"rank {rank} of {self.world_size} failed:\n{_tail(message['error'])}"
                + _printed(message),
                rank=rank, remote_traceback=message["error"],
            )
        if timeouts:
            waiting = {r: m["op"] for r, m in timeouts.items()}
            waiting.update({r: what for r, (_, what) in self._slots().items() if r not in waiting})
            # A peer whose collective failed because a timed-out rank's connection went
            # away was waiting too: in the collective it entered last.
            waiting.update({r: m["last_collective"] for r, m in errors.items()
                            if r not in waiting and m.get("last_collective")
                            and _is_cascade(m["error"])})
            self._raise_timeout(waiting)
        if deaths:
            rank = min(deaths)
            code = deaths[rank]
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            native = self._native_stderr(rank).rstrip()
            if native:
                said = f", after printing:\n{_tail(native, _NATIVE_STDERR_LINES)}"
            else:
                said = " (os._exit, a crash, or out of memory?)"
            raise LaunchError(
                f"rank {rank} of {self.world_size} {how} before reporting back{said}"
                + self._collectives_in_flight(errors),
                rank=rank, remote_traceback=native,
            )
        rank = min(errors)
        raise LaunchError(
            f"rank {rank} of {self.world_size} failed:\n{_tail(errors[rank]['error'])}",
            rank=rank, remote_traceback=errors[rank]["error"],
        )

    def _collectives_in_flight(self, errors: dict[int, dict]) -> str:
        """Which collective (op, axis, shape) each rank was in when the run ended: gloo
        aborts the process on a size mismatch with only its own sizes ("8 vs 4"), and
        the learner needs to see which call on which rank disagreed."""
        inside = {r: what for r, (_, what) in self._slots().items()}
        inside.update({r: m["last_collective"] for r, m in errors.items()
                       if r not in inside and m.get("last_collective")
                       and _is_cascade(m["error"])})
        if not inside:
            return ""
        lines = [f"  rank {r}: {what}" for r, what in sorted(inside.items())]
        return ("\nthe collective each rank was in (every rank of a group must call the same "
                "one, with the same shape):\n" + "\n".join(lines))

    def _raise_timeout(self, waiting: dict[int, str]) -> None:
        finished = sorted(r for r, m in self.messages.items() if m["status"] == "ok")
        lines = [f"  rank {r}: waiting in {op}" for r, op in sorted(waiting.items())]
        others = [r for r in range(self.world_size) if r not in waiting and r not in finished]
        if finished:
            lines.append(f"  ranks {finished}: had already returned from the function")
        if others:
            lines.append(f"  ranks {others}: busy outside any collective")
        raise CollectiveTimeout(
            f"a collective was not joined by every rank within timeout={self.timeout:g} s:\n"
            + "\n".join(lines)
            + "\nEvery rank of a group must call the same collectives in the same order.",
            waiting=dict(sorted(waiting.items())),
            finished=finished,
        )

    # -- ending ----------------------------------------------------------------
    def _release(self) -> None:
        for conn in self.conns.values():
            try:
                conn.send_bytes(b"done")
            except OSError:
                pass
        deadline = time.perf_counter() + _EXIT_WAIT_S
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
            process.join(_EXIT_WAIT_S)
            if process.exitcode is not None:
                process.close()
        for conn in self.conns.values():
            conn.close()
        self.processes, self.conns, self.status = [], {}, None


def _is_cascade(error_text: str) -> bool:
    """Errors that are echoes of another rank's failure (its sockets went away)."""
    last = error_text.strip().splitlines()[-1] if error_text.strip() else ""
    return any(pattern in last for pattern in _CASCADE_PATTERN)


def _tail(text: str, lines: int = 25) -> str:
    kept = text.rstrip().splitlines()
    if len(kept) > lines:
        kept = ["  ..."] + kept[-lines:]
    return "\n".join(kept)


def _printed(message: dict) -> str:
    printed = message.get("stdout", "").rstrip()
    return f"\n--- it printed ---\n{printed}" if printed else ""


# --------------------------------------------------------------------------- torchrun
def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _destroy_if_initialized() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _run_in_place(fn, world_size, args, kwargs, backend, timeout) -> Run:
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(
            f"launch(fn, {world_size}) under torchrun, which started {env_world} processes: "
            f"pass world_size={env_world} (or use --nproc-per-node/--nnodes to match)"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", env_world))
    if not dist.is_initialized():
        backend = _choose_backend(backend, local_ranks)
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(_device.process_group_backend(backend),
                                timeout=timedelta(seconds=timeout))
        # We opened it, so we close it: a gloo group left open at interpreter exit
        # sometimes aborts the process ("terminate called without an active exception").
        atexit.register(_destroy_if_initialized)
    else:  # torchrun's script made the group itself: follow what it chose
        backend = "nccl" if "nccl" in str(dist.get_backend()) else "gloo"
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    _device.set_current(device)
    started = time.perf_counter()
    trace.install(dist.get_rank(), started)
    rank = dist.get_rank()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        # Fail here, at once. The other ranks may be waiting in a collective this rank
        # will never join, so gathering the error would hang (or pair with their
        # collective and fail with a gloo error instead). torchrun stops the others.
        text = traceback.format_exc()
        if _is_cascade(text):  # the echo of another rank's end, not this rank's own fault
            raise LaunchError(
                f"rank {rank} of {env_world} lost a peer: a collective failed with "
                f"{text.strip().splitlines()[-1]!r}. Another rank of this job ended first "
                "(its process or its node died, or it failed): the error that ended it is "
                f"in that rank's log, on its node.\n{_tail(text, 8)}",
                rank=rank, remote_traceback=text,
            ) from exc
        raise LaunchError(
            f"rank {rank} of {env_world} failed:\n{_tail(text)}",
            rank=rank, remote_traceback=text,
        ) from exc
    # As in a launched run, results travel as CPU tensors detached from autograd.
    mine = {"result": _dump_result(result), "events": trace.events()}
    gathered: list = [None] * env_world
    dist.all_gather_object(gathered, mine)
    return Run(
        [pickle.loads(g["result"]) for g in gathered],
        [g["events"] for g in gathered],
        [""] * env_world,  # under torchrun each rank prints to its own terminal stream
        [""] * env_world,
        backend,
        time.perf_counter() - started,
    )

