"""Where ranks come from: a forkserver with torch and minitp imported, warmed up where an
interrupt is cheap, and the directories minitp makes in the temporary folder: each marked as
minitp's, so that what a launcher killed with SIGKILL left can be told apart from a user's own."""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import multiprocessing.context as mp_context
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.process as mp_process
import multiprocessing.spawn as mp_spawn
import multiprocessing.util as mp_util
import os
import shutil
import signal
import sys
import tempfile
import traceback

from ._processes import alive
from ._signals import interrupts_deferred
from .errors import LaunchError

# torch._dynamo: torch.utils.checkpoint imports it on first use, >1 s per rank;
# preloaded, the forkserver pays it once (measured: activation_table 5 s -> 1.6 s).
_PRELOAD = ["minitp", "minitp.runtime._worker", "torch._dynamo"]  # the whole package, torch with it
EXIT_WAIT_S = 5.0  # how long a rank may take to leave before it is killed

_context_cache = None


def context():
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


_warm_forkserver_pid = None    # the server that has answered a warm-up probe: torch imported
_started_forkserver_pid = None  # a server a warm-up started that has not answered it yet


def _server_pid():
    # The server's pid is private to multiprocessing (CPython's own tests read it too).
    return getattr(mp_forkserver._forkserver, "_forkserver_pid", None)


def warm_up(ctx) -> None:
    """Make sure the forkserver is running and has imported torch, *interruptibly*.

    Its first child waits for those imports (seconds, cold). Starting ranks happens
    with interrupts deferred (so no rank is ever half-started and lost), which is
    only acceptable if starting one takes milliseconds: so a throwaway child pays
    the cold start first. Only the wait for its answer can be interrupted, never the
    request (see `_WarmUpPopen`); and an interrupted cold start stops the server it
    started, so that nothing of it is left running or queued (see `_stop_cold_server`).
    """
    global _warm_forkserver_pid, _started_forkserver_pid
    if ctx.get_start_method() != "forkserver":
        return
    with interrupts_deferred():
        # Marked before the first process starts: a launcher killed at any later moment
        # leaves a directory the next launch knows for minitp's (its socket lives there).
        own_multiprocessing_directory()
        before = _server_pid()
        mp_forkserver.ensure_running()
        if _server_pid() != before:
            _started_forkserver_pid = _server_pid()
    pid = _server_pid()
    if pid is not None and pid == _warm_forkserver_pid:
        return
    probe = _WarmUpProcess(target=int, name="minitp-warm-up", daemon=True)
    try:
        with without_main_module():
            try:
                probe.start()
            except (ConnectionError, FileNotFoundError, EOFError):
                # The server is gone though ensure_running found it alive: it exits when
                # a client connects and leaves without sending its request (not minitp's,
                # whose requests go whole), and takes seconds to, refusing connections
                # while it still looks alive. Start a fresh one and try once more.
                _restart(ctx)
                probe = _WarmUpProcess(target=int, name="minitp-warm-up", daemon=True)
                probe.start()
        probe.join()
    except BaseException as stopped:
        # Cut short (Ctrl-C while the forkserver starts cold), a start leaves its
        # half-made Popen in the traceback's frames, holding two descriptors until the
        # garbage collector finds them; a started probe holds its sentinel. Free both now.
        if probe.pid is not None:
            probe.kill()
            probe.join(EXIT_WAIT_S)
            if probe.exitcode is not None:
                probe.close()
        elif _server_pid() is not None and _server_pid() == _started_forkserver_pid:
            _stop_cold_server()
        traceback.clear_frames(stopped.__traceback__)
        raise
    probe.close()
    _warm_forkserver_pid = _server_pid()
    _started_forkserver_pid = None  # it has answered: warm, and worth keeping


def _restart(ctx) -> None:
    """Stop multiprocessing's forkserver (reaping it, if it already exited) and start a
    new one with the same preloads."""
    global _started_forkserver_pid
    with interrupts_deferred():
        server = mp_forkserver._forkserver  # private, but what CPython's own tests use
        server._stop()
        server.ensure_running()
        _started_forkserver_pid = _server_pid()


def _stop_cold_server() -> None:
    """Stop the forkserver a warm-up started and that never answered it.

    It is still importing torch, with the warm-up's request queued: left alone, it would
    fork that child seconds later, after the interrupted launch has returned, and the
    next launch would wait for the rest of its imports anyway. Nothing else has used it,
    and it reads nothing until its imports are done, so it is killed; the next launch
    starts a fresh one."""
    global _started_forkserver_pid
    with interrupts_deferred():
        server = mp_forkserver._forkserver
        try:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop()  # closes this process's end of its alive pipe, reaps it, removes its socket
        _started_forkserver_pid = None


if sys.platform != "win32":
    from multiprocessing import popen_forkserver

    class _WarmUpPopen(popen_forkserver.Popen):
        """multiprocessing's forkserver start, except that Ctrl-C cannot cut the request.

        CPython's forkserver exits when a client connects and leaves before sending its
        descriptors (EOFError in its loop), and takes seconds to (1.6 s idle, up to 9 s on
        a loaded 2-core machine, measured), refusing every connection meanwhile while it
        still looks alive. A Ctrl-C landing just after the connection opened did exactly
        that. So the request (connect, descriptors, the child's data) is sent with
        interrupts deferred, in microseconds; only the wait for the answer, seconds on a
        cold start, can be interrupted. The steps are CPython's own (3.11 to 3.14).
        """

        def _launch(self, process_obj):
            preparation = mp_spawn.get_preparation_data(process_obj._name)
            data = io.BytesIO()
            mp_context.set_spawning_popen(self)
            try:
                mp_context.reduction.dump(preparation, data)
                mp_context.reduction.dump(process_obj, data)
            finally:
                mp_context.set_spawning_popen(None)
            with interrupts_deferred():
                self.sentinel, data_end = mp_forkserver.connect_to_new_process(self._fds)
                # A copy of the data pipe's end stays open while this process lives: the
                # child's sign that its parent is alive.
                parent_end = os.dup(data_end)
                self.finalizer = mp_util.Finalize(self, mp_util.close_fds,
                                                  (parent_end, self.sentinel))
                with open(data_end, "wb", closefd=True) as pipe:
                    pipe.write(data.getbuffer())
            self.pid = mp_forkserver.read_signed(self.sentinel)

    class _WarmUpProcess(mp_context.ForkServerProcess):
        _Popen = staticmethod(_WarmUpPopen)


# A launcher killed with SIGKILL (a kernel restart, the OOM killer) runs no cleanup: its
# ranks and forkserver follow it (see _worker._die_with_launcher), but two directories
# stay in the temporary folder: the launch's rendezvous directory and multiprocessing's
# own `pymp-*` directory (the forkserver's socket). Each carries minitp's mark, a file
# holding the launcher's pid, so the next launch, in any process, removes those whose
# launcher is gone. A directory without the mark is never touched, whatever its name.
RENDEZVOUS_PREFIX = "minitp-"   # + "<launcher pid>-<random>"; the pid is for people reading
OWNER_FILE = ".minitp-owner"    # the mark: the pid of the process that made the directory
SUN_PATH_MAX = 103 if sys.platform == "darwin" else 107  # sun_path's bytes, less its NUL
SOCKET_SUFFIX_LEN = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def make_owned_directory(prefix: str) -> str:
    """A new private directory in the temporary folder, carrying minitp's mark."""
    path = tempfile.mkdtemp(prefix=prefix)
    _sign(path)
    return path


def own_multiprocessing_directory() -> None:
    """Mark this process's `pymp-*` directory as a minitp launcher's (made now if need be,
    where the forkserver's socket fits: `_short_enough_base`)."""
    if mp_process.current_process()._config.get("tempdir") is None:
        base = _short_enough_base()
        if base != tempfile.gettempdir():  # as multiprocessing makes it, in another folder
            path = tempfile.mkdtemp(prefix="pymp-", dir=base)
            mp_util.Finalize(None, mp_util._remove_temp_dir, args=(shutil.rmtree, path),
                             exitpriority=-100)
            mp_process.current_process()._config["tempdir"] = path
    path = mp_util.get_temp_dir()
    if not os.path.exists(os.path.join(path, OWNER_FILE)):
        _sign(path)


def _short_enough_base() -> str:
    """Where `pymp-*` can go: the temporary folder, unless the forkserver's socket,
    ``<folder>/pymp-XXXXXXXX/listener-XXXXXXXX``, would pass an AF_UNIX address's length
    (a TMPDIR of more than ~75 characters: Python before 3.14 then fails every launch with
    "AF_UNIX path too long"); then /tmp or /var/tmp, as Python 3.14 does (gh-132124)."""
    base = tempfile.gettempdir()
    if len(base) + SOCKET_SUFFIX_LEN <= SUN_PATH_MAX:
        return base
    for short in ("/tmp", "/var/tmp"):
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
            return short
    raise LaunchError(f"the temporary folder {base!r} is {len(base)} characters long, too long "
                      "for the forkserver's socket, and /tmp is not writable: set a shorter "
                      "TMPDIR")


def _sign(directory: str) -> None:
    # Written whole, then renamed into place: the mark is either absent or complete,
    # never a pid cut short that could name another process.
    fd, staging = tempfile.mkstemp(prefix=f"{OWNER_FILE}-", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(staging, os.path.join(directory, OWNER_FILE))


def remove_what_dead_launchers_left() -> None:
    folders = {tempfile.gettempdir()}
    made = mp_process.current_process()._config.get("tempdir")  # this process's pymp-*, if any
    if made:  # (asking multiprocessing for it would make one, unmarked, before the mark)
        folders.add(os.path.dirname(made))
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith((RENDEZVOUS_PREFIX, "pymp-")) and _left_by_a_dead_launcher(
                    entry):
                shutil.rmtree(entry.path, ignore_errors=True)


def _left_by_a_dead_launcher(entry: os.DirEntry) -> bool:
    """A directory of this user's carrying minitp's mark, whose maker no longer runs."""
    try:
        if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
            return False
        with open(os.path.join(entry.path, OWNER_FILE)) as f:
            pid = f.read().strip()
    except OSError:  # no mark (not minitp's), or it went while we looked
        return False
    return pid.isdigit() and not alive(int(pid))


@contextlib.contextmanager
def without_main_module():
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
