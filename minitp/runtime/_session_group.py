"""A live session's group of ranks, from start to stop: started from `mt.launch`'s forkserver,
each rank with its pipe, lifeline, status slot and flight ring (`_session_rank` runs inside
it); stopped by killing every rank and freeing all it held. What a request does with them is
`minitp.runtime.session`'s."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.resource_tracker as mp_tracker
import os
import shutil
import signal
import sys
import time
import weakref

from . import _forkserver as _fs
from ._flight_recorder import RING_BYTES
from ._rank_set import _loopback_interface, _threads_per_rank
from ._session_rank import RENDEZVOUS_S
from ._session_rank import main as _rank_main
from ._signals import interrupts_deferred
from ._worker import STATUS_SLOT_BYTES, native_stderr_path, read_native_stderr

MESH_AXES = ("dp", "pp", "tp", "cp", "ep")
_live: weakref.WeakSet = weakref.WeakSet()  # every group started and not yet stopped


def release_all() -> None:
    """Stop every live group, then multiprocessing's forkserver and resource tracker,
    reaping them: for a Jupyter kernel about to shut down or restart.

    ipykernel's shutdown first SIGTERMs every child in its process group, then waits until
    none is left, checking for 14 s; the forkserver and the tracker, never reaped, stay
    there as zombies, so jupyter_client's patience (2.5 s) runs out and it SIGTERMs the
    kernel, which then dies without its exit handlers: the directories stay behind
    (measured, ipykernel 7.4, jupyter_client 8.10). Stopped here, each is reaped first.
    """
    for group in list(_live):
        group._stop("the kernel is shutting down")
    with interrupts_deferred():
        server = mp_forkserver._forkserver  # private, but what CPython's own tests use
        if server._forkserver_pid is not None:
            # Its ranks are gone; left to exit by itself, it would spend 1.6 s unloading
            # torch (measured), and the kernel's shutdown would wait for it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop()  # reaps it, removes its socket
        mp_tracker._resource_tracker._stop()


def parse_mesh(mesh, world_size: int) -> dict:
    """``"dp=2,tp=2"`` or ``{"dp": 2, "tp": 2}`` -> the dict each rank builds `Mesh` from."""
    if mesh is None:
        return {}
    if isinstance(mesh, str):
        try:
            mesh = {k.strip(): int(v) for k, v in (p.split("=") for p in mesh.split(",") if p)}
        except ValueError:
            raise ValueError(f"mesh {mesh!r}: write it as axis=size pairs, e.g. 'dp=2,tp=2'"
                             ) from None
    unknown = sorted(set(mesh) - set(MESH_AXES))
    if unknown or any(not isinstance(v, int) or v < 1 for v in mesh.values()):
        raise ValueError(f"mesh {mesh}: axes are {', '.join(MESH_AXES)}, each a positive int")
    size = 1
    for v in mesh.values():
        size *= v
    if size != world_size:
        raise ValueError(f"mesh {mesh} holds {size} ranks, the session {world_size}")
    return dict(mesh)


def hook_kernel_shutdown() -> None:
    """In a Jupyter kernel: run `release_all` when the kernel is asked to shut down or
    restart, before ipykernel signals its children. Outside one, nothing."""
    ipython = sys.modules.get("IPython")  # imported only if the kernel already has it
    kernel = getattr(ipython.get_ipython(), "kernel", None) if ipython else None
    if kernel is None or hasattr(kernel, "_minitp_do_shutdown"):
        return
    kernel._minitp_do_shutdown = kernel.do_shutdown

    def do_shutdown(restart):
        release_all()
        return kernel._minitp_do_shutdown(restart)

    kernel.do_shutdown = do_shutdown


class RankGroup:
    """The processes of a session; `Session` adds the requests (and ``_collect``)."""

    world_size: int
    timeout: float
    backend: str
    mesh: dict
    stopped: str | None = "not started"  # why the group is down, or None: it is up
    status = flight = lifeline = directory = None

    def start(self) -> None:
        ctx = _fs.context()
        _fs.remove_what_dead_launchers_left()
        _fs.warm_up(ctx)
        env = {"OMP_NUM_THREADS": str(_threads_per_rank(self.world_size))}
        if _loopback_interface() and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = _loopback_interface()
        with interrupts_deferred():
            self.status = ctx.RawArray(ctypes.c_char, STATUS_SLOT_BYTES * self.world_size)
            self.flight = ctx.RawArray(ctypes.c_char, RING_BYTES * self.world_size)
            self.directory = _fs.make_owned_directory(f"{_fs.RENDEZVOUS_PREFIX}{os.getpid()}-")
            lifeline_in, self.lifeline = ctx.Pipe(duplex=False)
            atexit.register(self.close)  # a kernel's shutdown leaves no rank, no directory
            hook_kernel_shutdown()
            _live.add(self)
            for rank in range(self.world_size):
                parent_end, child_end = ctx.Pipe(duplex=True)
                self.conns[rank] = parent_end
                process = ctx.Process(target=_rank_main, name=f"minitp-session-rank{rank}", args=(
                    rank, self.world_size, os.path.join(self.directory, "store"), self.backend,
                    self.timeout, _threads_per_rank(self.world_size), child_end, self.status,
                    self.flight, env, lifeline_in, native_stderr_path(self.directory, rank),
                    self.mesh),
                    daemon=True)
                with _fs.without_main_module():
                    process.start()
                self.processes.append(process)
                child_end.close()
            lifeline_in.close()
        self.stopped = None
        try:
            self._collect(range(self.world_size), starting=True)
        except BaseException:
            self._stop("it failed to start")
            raise

    # -- what the failure reports read -------------------------------------------------
    def slots(self) -> dict[int, tuple[float, str]]:
        """What each rank is waiting in right now, and since when (wall clock)."""
        if self.status is None:
            return {}
        raw, slots = self.status.raw, {}
        for rank in range(self.world_size):
            chunk = raw[rank * STATUS_SLOT_BYTES:(rank + 1) * STATUS_SLOT_BYTES].split(b"\0")[0]
            if chunk:
                since, _, what = chunk.decode(errors="replace").partition("|")
                slots[rank] = (float(since), what)
        return slots

    def _overdue(self, starting: bool) -> bool:
        # A backstop, as in a launch: the backend's own timeout comes first.
        limit = max(self.timeout, RENDEZVOUS_S) if starting else self.timeout
        now = time.time()
        return any(now - since > limit + 2.0 for since, _ in self.slots().values())

    def native_stderr(self, rank: int) -> str:
        return read_native_stderr(self.directory, rank)

    def _stop(self, why: str) -> None:
        """Kill every rank and free what the group held: pipes, shared arrays, directory."""
        with interrupts_deferred():
            for process in self.processes:
                if process.exitcode is None:
                    process.kill()
            for process in self.processes:
                process.join(_fs.EXIT_WAIT_S)
                if process.exitcode is not None:
                    process.close()
            for end in [*self.conns.values(), self.lifeline]:
                if end is not None:
                    end.close()
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
            self.processes, self.conns, self.lifeline, self.directory = [], {}, None, None
            self.status = self.flight = None
            self.stopped = why
            _live.discard(self)
