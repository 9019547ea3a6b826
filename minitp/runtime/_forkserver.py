"""Where ranks come from: a forkserver with torch and minitp imported, warmed up where an
interrupt is cheap, and what a launcher killed with SIGKILL left in the temporary folder."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.spawn as mp_spawn
import multiprocessing.util as mp_util
import os
import shutil
import tempfile
import traceback

from ._processes import alive
from ._signals import interrupts_deferred

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


_warm_forkserver_pid = None


def warm_up(ctx) -> None:
    """Make sure the forkserver is running and has imported torch, *interruptibly*.

    Its first child waits for those imports (seconds, cold). Starting ranks happens
    with interrupts deferred (so no rank is ever half-started and lost), which is
    only acceptable if starting one takes milliseconds: so a throwaway child pays
    the cold start first, where an interrupt costs nothing (it exits at once).
    """
    global _warm_forkserver_pid
    if ctx.get_start_method() != "forkserver":
        return
    with interrupts_deferred():
        mp_forkserver.ensure_running()
    # The server's pid is private to multiprocessing; without it, warm up every time.
    pid = getattr(mp_forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None and pid == _warm_forkserver_pid:
        return
    probe = ctx.Process(target=int, name="minitp-warm-up", daemon=True)
    try:
        with without_main_module():
            try:
                probe.start()
            except (ConnectionError, FileNotFoundError, EOFError):
                # The server is gone though ensure_running found it alive: CPython's
                # forkserver exits when a client connects and leaves without sending its
                # descriptors (a start cut short by Ctrl-C), and it may still have been
                # exiting when we looked. Start a fresh one and try once more.
                _restart(ctx)
                probe = ctx.Process(target=int, name="minitp-warm-up", daemon=True)
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
        traceback.clear_frames(stopped.__traceback__)
        raise
    probe.close()
    _warm_forkserver_pid = getattr(mp_forkserver._forkserver, "_forkserver_pid", None)
    _sign_multiprocessing_directory()


def _restart(ctx) -> None:
    """Stop multiprocessing's forkserver (reaping it, if it already exited) and start a
    new one with the same preloads."""
    with interrupts_deferred():
        server = mp_forkserver._forkserver  # private, but what CPython's own tests use
        server._stop()
        server.ensure_running()


# A launcher killed with SIGKILL (a kernel restart, the OOM killer) runs no cleanup: its
# ranks and forkserver follow it (see _worker._die_with_launcher), but two directories
# stay in the temporary folder: the launch's rendezvous directory and multiprocessing's
# own `pymp-*` directory (the forkserver's socket). Each carries the launcher's pid, so
# the next launch, in any process, removes those whose launcher is gone.
RENDEZVOUS_PREFIX = "minitp-"                # + "<launcher pid>-<random>"
_MULTIPROCESSING_MARK = "minitp-launcher-"    # + "<launcher pid>", a file in pymp-*


def _sign_multiprocessing_directory() -> None:
    """Mark this process's `pymp-*` directory as a minitp launcher's, with its pid."""
    mark = os.path.join(mp_util.get_temp_dir(), f"{_MULTIPROCESSING_MARK}{os.getpid()}")
    if not os.path.exists(mark):
        with contextlib.suppress(OSError):
            open(mark, "x").close()


def remove_what_dead_launchers_left() -> None:
    folders = {tempfile.gettempdir(), os.path.dirname(mp_util.get_temp_dir())}
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(RENDEZVOUS_PREFIX):
                pids = [entry.name.removeprefix(RENDEZVOUS_PREFIX).split("-")[0]]
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
