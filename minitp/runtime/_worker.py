"""What runs inside each launched rank. The forkserver preloads this module (and
with it torch and minitp), so a new rank starts in milliseconds, not seconds.

A rank: joins the process group through a file store the parent named, runs the
user's function, sends back one message (its result or its failure, its events
and what it printed), then waits for the parent's word before leaving, so that
a rank that finished early never pulls the connections from under ranks still
working or waiting.
"""

from __future__ import annotations

import ctypes
import io
import linecache
import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from . import _device, _flight_recorder, _pickling, trace
from ._pickling import CodeKeepingPickler
from .errors import RankTimedOut

STATUS_SLOT_BYTES = 512  # per rank: "<since>|<op description>" while inside a collective
_LAUNCHER_GONE_EXIT_CODE = 75  # what a rank exits with when its launcher went away


class _ResultPickler(CodeKeepingPickler):
    """Sends results back as plain CPU tensors, detached from any graph.

    Plain pickling (not torch.multiprocessing's shared-memory handles) keeps the
    message self-contained: the rank can exit the moment it has been read.
    """

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            plain = obj.detach().cpu() if obj.requires_grad or obj.device.type != "cpu" else obj
            if _is_view_of_more(plain):
                # A tensor pickles its whole storage: 4 elements viewed out of 100 MiB
                # would ship 100 MiB. Send a copy of just the elements it shows.
                plain = plain.clone()
            if plain is not obj:
                return _rebuild_tensor, (plain,)
        return super().reducer_override(obj)


def _rebuild_tensor(t):
    return t


def _is_view_of_more(t: torch.Tensor) -> bool:
    if t.layout != torch.strided:
        return False
    return t.untyped_storage().nbytes() > t.numel() * t.element_size()


def dumps(obj) -> bytes:
    return _pickling.dumps(obj, _ResultPickler)


def _die_with_launcher(lifeline) -> None:
    """End this rank the moment the launching process is gone, however it went.

    A rank's parent is the forkserver, not the launching process (a Jupyter kernel),
    so the parent-death signal alone would tie it to the wrong process; and the
    forkserver outlives a SIGKILLed kernel as long as any rank holds its "alive"
    pipe, which every rank inherits. So the launcher hands each rank the read end
    of a pipe whose only write end it keeps and never writes to: end of file on it
    means the launcher closed it (the launch is over) or died (SIGKILL, OOM, a
    kernel restart). A thread waits for that and ends the process. With the ranks
    gone, nothing holds the forkserver's alive pipe but the (gone) launcher, so it
    exits too.
    """
    def wait_for_end_of_file():
        try:
            lifeline.poll(None)  # never written to: returns only at end of file
        except (OSError, EOFError):
            pass
        os._exit(_LAUNCHER_GONE_EXIT_CODE)

    threading.Thread(target=wait_for_end_of_file, name="minitp-lifeline", daemon=True).start()
    # Belt and braces: if the forkserver dies, so does this rank (Linux).
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        except OSError:
            pass


def native_stderr_path(directory: str, rank: int) -> str:
    """Where rank `rank` of a group whose files live in `directory` (a launch's or a
    session's) has its file descriptor 2 (`_capture_native_stderr`)."""
    return os.path.join(directory, f"rank{rank}.stderr")


def read_native_stderr(directory: str | None, rank: int) -> str:
    """What rank `rank`'s native (C++) side wrote there; "" where nothing can be read (the
    group's directory already removed, or never made)."""
    try:
        with open(native_stderr_path(directory, rank), errors="replace") as f:
            return f.read()
    except (OSError, TypeError):
        return ""


def _capture_native_stderr(path: str) -> None:
    """Point file descriptor 2 at `path`, so what torch's and gloo's C++ code prints
    (an abort's reason, say) reaches the launcher's error instead of the terminal
    the forkserver was started from (in Jupyter: the server's log, out of sight)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


LIVE = "live"  # the status of a message that carries console text, not the rank's result


class _Console(io.TextIOBase):
    """A text stream whose writes reach the launcher's stderr as they happen.

    What a rank prints to ``sys.stdout``/``sys.stderr`` comes back with its result, at the
    end, kept apart per rank. A progress bar must be seen while the run goes on, so
    it is written here instead: each write travels up the rank's pipe as a message of
    its own, and the launcher copies it to its own stderr (a terminal, or the notebook
    cell that launched the run). File descriptor 2 is not used: it is kept for what
    native code prints when it aborts (see `_capture_native_stderr`).
    """

    def __init__(self, conn, isatty: bool):
        self._conn, self._isatty = conn, isatty
        self._lock = threading.Lock()  # one message at a time, whichever thread writes

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._isatty

    def write(self, text: str) -> int:
        if text:
            message = pickle.dumps({"status": LIVE, "text": text})
            with self._lock:
                try:
                    self._conn.send_bytes(message)
                except OSError:  # the launcher is gone; the lifeline ends this rank
                    pass
        return len(text)


_console: io.TextIOBase | None = None


def console():
    """Where a rank writes what a person should see while the run goes on (a progress
    bar, evaluation lines): in a rank of `mt.launch`, a stream that reaches the
    launcher's terminal or notebook at once; elsewhere (under torchrun, or in the
    launching process itself) the process's own stderr."""
    return _console if _console is not None else sys.__stderr__


class _StatusSlot:
    """A view of this rank's slot in the shared status array, stamped with the time.

    It also remembers the last collective entered: when a collective fails because a
    peer's connection went away (an echo of the peer's timeout), the slot has been
    cleared, but the report still has to say which collective this rank was in.
    """

    def __init__(self, array, rank):
        self._raw = (ctypes.c_char * STATUS_SLOT_BYTES).from_buffer(array, rank * STATUS_SLOT_BYTES)
        self.last_entered = ""

    def __len__(self):
        return STATUS_SLOT_BYTES

    @property
    def value(self):
        return self._raw.value

    @value.setter
    def value(self, data: bytes):
        if data:
            self.last_entered = data.decode(errors="replace")
            data = f"{time.time():.3f}|".encode() + data
        self._raw.value = data[: STATUS_SLOT_BYTES - 1]


def main(rank, world_size, payload, store_path, backend, timeout, threads, conn, status, flight,
         t0, env, lifeline, native_stderr_path, sources, console_isatty):
    global _console
    _die_with_launcher(lifeline)
    _console = _Console(conn, console_isatty)
    _capture_native_stderr(native_stderr_path)
    # Source lines of code defined in notebook cells, so this rank's tracebacks show them.
    linecache.cache.update(sources)
    os.environ.update(env)
    torch.set_num_threads(threads)
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    recorder = trace.install(rank, t0)
    recorder.status_slot = _StatusSlot(status, rank)
    recorder.flight = _flight_recorder.Ring(flight, rank)
    message = {"rank": rank}
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _device.set_current(device)
        recorder.enter(lambda: "the rendezvous (joining the process group)")
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(timedelta(seconds=timeout))  # not FileStore's default 300 s
        dist.init_process_group(
            _device.process_group_backend(backend), store=store, rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        recorder.leave()
        result = fn(*args, **kwargs)
        try:
            message.update(status="ok", result=dumps(result))
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to see
            raise TypeError(
                f"rank {rank} returned a {type(result).__name__} that cannot be sent back "
                f"to the parent: {exc}"
            ) from exc
    except RankTimedOut as exc:
        message.update(status="timeout", op=exc.op, error=_user_traceback(exc))
    except BaseException as exc:  # noqa: BLE001 - report everything, KeyboardInterrupt included
        text = _user_traceback(exc)
        status_ = "timeout" if _looks_like_timeout(exc) else "error"
        message.update(status=status_, op="a collective outside minitp.runtime.comm", error=text)
    message.update(events=trace.events(), stdout=out.getvalue(), stderr=err.getvalue(),
                   last_collective=recorder.status_slot.last_entered)
    try:
        with _console._lock:  # after any console text still being sent
            conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        conn.recv_bytes()  # the parent's word: everyone is done (or EOF: the parent is gone)
    except (EOFError, OSError):
        pass
    # No destroy_process_group(): it can block on peers that are leaving at the same
    # moment. The process ends right after this; the OS closes every socket.


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the user's code down, without this module's frame."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is main.__code__ and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _looks_like_timeout(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and "timed out" in str(exc).lower()
